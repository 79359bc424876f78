//! Which of a VM's actions make sense in its state (KubeVirt's `printableStatus`): the
//! dashboard shows only those. The API still judges every request on its own; this only
//! keeps a person from being offered Start on a running VM or Unpause on one not paused.

/// The actions the VM page offers (form values of its action buttons), and `console` for
/// its console links, for a VM whose `printableStatus` is `status`.
pub fn allowed(status: &str) -> &'static [&'static str] {
    match status {
        "Stopped" | "" | "-" => &["start", "delete"],
        "Running" => &[
            "stop",
            "restart",
            "pause",
            "softreboot",
            "migrate",
            "delete",
            "console",
        ],
        "Migrating" => &[
            "stop",
            "restart",
            "pause",
            "softreboot",
            "delete",
            "console",
        ],
        "Paused" => &["stop", "restart", "unpause", "delete", "console"],
        "Stopping" | "Terminating" => &["delete"],
        // Starting, provisioning, waiting, or failing to start (unschedulable, image pull,
        // crash loop): stopping ends the attempts.
        _ => &["stop", "delete"],
    }
}

#[cfg(test)]
mod tests {
    use super::allowed;

    #[test]
    fn each_state_offers_only_what_it_allows() {
        assert_eq!(allowed("Stopped"), ["start", "delete"]);
        assert!(!allowed("Running").contains(&"start"));
        assert!(!allowed("Running").contains(&"unpause"));
        assert!(allowed("Paused").contains(&"unpause") && !allowed("Paused").contains(&"pause"));
        assert!(!allowed("Stopped").contains(&"console"));
        assert!(allowed("Running").contains(&"migrate"));
        assert!(
            !allowed("Migrating").contains(&"migrate"),
            "one move at a time"
        );
        assert!(!allowed("Paused").contains(&"migrate"));
        assert_eq!(allowed("ErrorUnschedulable"), ["stop", "delete"]);
        assert_eq!(allowed("Terminating"), ["delete"]);
    }
}
