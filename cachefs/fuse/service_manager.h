// Keeping a mount across `systemctl restart`: systemd's file descriptor store.
//
// Under systemd (deploy/systemd/ember-node.service: Type=notify, FileDescriptorStoreMax=) the
// supervisor says READY=1 once its agent serves. Stopped while a restart of its unit is queued
// (`systemctl restart`, a package upgrade), it takes the mount from its agent and stores it in
// the manager instead of unmounting: the /dev/fuse fd, the peer listener and the state in a memfd
// (FDSTORE=1, named ember-fuse, ember-peers, ember-state). systemd keeps stored fds while a job
// for the unit is queued and passes them to the next start (LISTEN_FDS, LISTEN_FDNAMES), whose
// supervisor continues the mount. A plain stop unmounts as before (the store is released when the
// unit goes inactive). The protocol is sd_notify(3)'s and sd_listen_fds(3)'s, spoken directly.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "cachefs/fuse/mount_state.h"

namespace ember::cachefs {

// True if this process was started by a service manager that listens for notifications.
bool UnderServiceManager();

// Sends `text` (e.g. "READY=1") with `fds` to the service manager. Returns: Ok (also when there
// is none); Unavailable.
absl::Status NotifyServiceManager(const std::string& text, const std::vector<int>& fds = {});

// True if the service manager is restarting this process's unit (a restart job is queued for
// it), asked of `systemctl list-jobs`; EMBER_TEST_RESTART_QUEUED=1/0 answers instead (tests).
bool RestartQueued();

// Stores the mount (with its state) in the service manager for the next start.
// Returns: Ok; Internal / Unavailable naming what failed (nothing was kept then).
absl::Status StoreMount(const KernelFuseState& state);

// The mount a previous start stored (passed back in LISTEN_FDS), if any; other passed fds are
// closed. It stays in the store (a start that fails gets it again) until ForgetStoredMount.
// Returns: nullopt if none was passed (or it is unreadable: logged).
std::optional<KernelFuseState> MountFromServiceManager();
// Takes the stored mount out of the store (once an agent serves it again).
void ForgetStoredMount();

}  // namespace ember::cachefs
