#include "common/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace ember::metrics {

void Histogram::Observe(double seconds) {
  size_t i = 0;
  while (i < kBounds.size() && seconds > kBounds[i]) i++;
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(static_cast<uint64_t>(std::max(0.0, seconds) * 1e9), std::memory_order_relaxed);
}

std::string RenderLabels(const Labels& labels) {
  if (labels.empty()) return "";
  std::string out = "{";
  for (size_t i = 0; i < labels.size(); i++) {
    if (i > 0) out += ',';
    out += labels[i].first;
    out += "=\"";
    for (char c : labels[i].second) {
      if (c == '\\' || c == '"') out += '\\';
      if (c == '\n') {
        out += "\\n";
        continue;
      }
      out += c;
    }
    out += '"';
  }
  return out + "}";
}

Registry::Family& Registry::FamilyOf(const std::string& name, const std::string& help,
                                     const std::string& type) {
  Family& f = families_[name];
  if (f.type.empty()) {
    f.help = help;
    f.type = type;
  }
  return f;
}

Counter* Registry::GetCounter(const std::string& name, const std::string& help,
                              const Labels& labels) {
  std::lock_guard lock(mu_);
  auto& slot = FamilyOf(name, help, "counter").counters[RenderLabels(labels)];
  if (!slot) slot = std::make_unique<Counter>();
  return slot.get();
}

Histogram* Registry::GetHistogram(const std::string& name, const std::string& help,
                                  const Labels& labels) {
  std::lock_guard lock(mu_);
  auto& slot = FamilyOf(name, help, "histogram").histograms[RenderLabels(labels)];
  if (!slot) slot = std::make_unique<Histogram>();
  return slot.get();
}

void Registry::SetCallback(const std::string& name, const std::string& help,
                           const std::string& type, const Labels& labels,
                           std::function<double()> fn) {
  std::lock_guard lock(mu_);
  FamilyOf(name, help, type).callbacks[RenderLabels(labels)] = std::move(fn);
}

void Registry::SetCollector(const std::string& name, const std::string& help,
                            const std::string& type, std::function<Samples()> fn) {
  std::lock_guard lock(mu_);
  FamilyOf(name, help, type).collector = std::move(fn);
}

void Registry::RemoveCallbacks(const std::string& name_prefix) {
  std::lock_guard lock(mu_);
  for (auto& [name, f] : families_) {
    if (name.rfind(name_prefix, 0) == 0) {
      f.callbacks.clear();
      f.collector = nullptr;
    }
  }
}

namespace {

std::string Num(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  if (v == std::floor(v) && std::fabs(v) < 1e15) {
    std::snprintf(buf, sizeof(buf), "%.0f", v);
  } else {
    std::snprintf(buf, sizeof(buf), "%.9g", v);
  }
  return buf;
}

// Inserts an extra label into a rendered label set.
std::string WithLabel(const std::string& rendered, const std::string& extra) {
  if (rendered.empty()) return "{" + extra + "}";
  return rendered.substr(0, rendered.size() - 1) + "," + extra + "}";
}

}  // namespace

std::string Registry::Render() {
  // Callbacks may take other locks: copy them out first.
  struct Snap {
    std::string help, type;
    std::vector<std::pair<std::string, uint64_t>> counters;
    std::vector<std::pair<std::string, const Histogram*>> histograms;
    std::vector<std::pair<std::string, std::function<double()>>> callbacks;
    std::function<Samples()> collector;
  };
  std::map<std::string, Snap> snap;
  {
    std::lock_guard lock(mu_);
    for (const auto& [name, f] : families_) {
      Snap& s = snap[name];
      s.help = f.help;
      s.type = f.type;
      for (const auto& [l, c] : f.counters) s.counters.emplace_back(l, c->Value());
      for (const auto& [l, h] : f.histograms) s.histograms.emplace_back(l, h.get());
      for (const auto& [l, fn] : f.callbacks) s.callbacks.emplace_back(l, fn);
      s.collector = f.collector;
    }
  }
  std::string out;
  for (const auto& [name, s] : snap) {
    Samples collected;
    if (s.collector) collected = s.collector();
    if (s.counters.empty() && s.histograms.empty() && s.callbacks.empty() && !s.collector) {
      continue;
    }
    out += "# HELP " + name + " " + s.help + "\n# TYPE " + name + " " + s.type + "\n";
    for (const auto& [labels, v] : collected)
      out += name + RenderLabels(labels) + " " + Num(v) + "\n";
    for (const auto& [l, v] : s.counters)
      out += name + l + " " + Num(static_cast<double>(v)) + "\n";
    for (const auto& [l, fn] : s.callbacks) out += name + l + " " + Num(fn()) + "\n";
    for (const auto& [l, h] : s.histograms) {
      uint64_t cumulative = 0;
      for (size_t i = 0; i <= Histogram::kBounds.size(); i++) {
        cumulative += h->buckets_[i].load(std::memory_order_relaxed);
        std::string le = i < Histogram::kBounds.size() ? Num(Histogram::kBounds[i]) : "+Inf";
        out += name + "_bucket" + WithLabel(l, "le=\"" + le + "\"") + " " +
               Num(static_cast<double>(cumulative)) + "\n";
      }
      out += name + "_sum" + l + " " + Num(h->sum_ns_.load() / 1e9) + "\n";
      out += name + "_count" + l + " " + Num(static_cast<double>(h->count_.load())) + "\n";
    }
  }
  return out;
}

Registry& Global() {
  static Registry* r = new Registry();
  return *r;
}

}  // namespace ember::metrics
