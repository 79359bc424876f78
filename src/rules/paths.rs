//! Where things live on a node, for every role that needs to find them: the agent writes a
//! VMI's runtime files, the console proxy connects to the sockets among them.

use std::path::{Path, PathBuf};

/// Where a VMI's runtime files live: its domain XML, NoCloud ISOs, and the VNC and serial
/// sockets the console proxy connects to.
pub fn vmi_run_dir(data_dir: &Path, vmi_uid: &str) -> PathBuf {
    data_dir.join("run/vmi").join(vmi_uid)
}
