// Validates every Kubernetes object in the given YAML files against the Kubernetes API schemas
// (npm kubernetes-models), offline. Component configs (KubeSchedulerConfiguration) are checked
// for their fields by hand. Prints one line per object; exits 1 on the first invalid file.
import fs from "node:fs";
import YAML from "yaml";

const groups = {
  "v1": "kubernetes-models/v1",
  "apps/v1": "kubernetes-models/apps/v1",
  "rbac.authorization.k8s.io/v1": "kubernetes-models/rbac.authorization.k8s.io/v1",
  "policy/v1": "kubernetes-models/policy/v1",
  "storage.k8s.io/v1": "kubernetes-models/storage.k8s.io/v1",
  "admissionregistration.k8s.io/v1": "kubernetes-models/admissionregistration.k8s.io/v1",
};
let bad = 0, checked = 0;
for (const file of process.argv.slice(2)) {
  for (const doc of YAML.parseAllDocuments(fs.readFileSync(file, "utf8"))) {
    const obj = doc.toJS();
    if (!obj) continue;
    const where = `${file}: ${obj.kind}/${obj.metadata?.name ?? "?"}`;
    try {
      if (obj.kind === "KubeSchedulerConfiguration") {
        const ext = obj.extenders?.[0];
        if (!obj.apiVersion?.startsWith("kubescheduler.config.k8s.io/")) throw new Error("apiVersion");
        if (!ext?.urlPrefix || !ext.filterVerb || !ext.prioritizeVerb) throw new Error("extender fields");
      } else {
        const mod = groups[obj.apiVersion];
        if (!mod) throw new Error(`no schema for apiVersion ${obj.apiVersion}`);
        const Model = (await import(mod))[obj.kind];
        if (!Model) throw new Error(`no model for ${obj.kind}`);
        new Model(obj).validate();
      }
      console.log(`ok   ${where}`);
      checked++;
    } catch (e) {
      console.log(`BAD  ${where}: ${e.message}`);
      bad++;
    }
  }
}
console.log(`${checked} valid, ${bad} invalid`);
process.exit(bad > 0 || checked === 0 ? 1 : 0);
