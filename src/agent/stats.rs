//! The node's figures for `/metrics` and the dashboard's graphs: every interval, libvirt's
//! bulk stats of the running domains and the host's own figures, sent to the controller
//! in one [`NodeReport`]. A controller that does not take them (an older release) is told
//! once in the log; the VMs never notice either way.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::Agent;
use crate::metrics::{HostSample, NodeReport};

/// Collect and send until cancelled.
pub async fn run(agent: Arc<Agent>, cancel: CancellationToken) {
    let every = agent.cfg.stats_interval;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let path = format!("/apis/edgevirt.io/v1/nodes/{}/stats", agent.cfg.node_name);
    let mut refused = false;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let report = match collect(&agent).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "collecting domain stats failed");
                continue;
            }
        };
        let body = match serde_json::to_value(&report) {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(error = %e, "encoding the node report failed");
                continue;
            }
        };
        match agent.api.put(&path, &body).await {
            Ok(_) => refused = false,
            Err(e) if crate::client::is_status(&e, reqwest::StatusCode::NOT_FOUND) => {
                if !refused {
                    tracing::info!("the controller does not take node figures (an older release?)");
                }
                refused = true;
            }
            Err(e) => tracing::debug!(error = %e, "sending node figures failed"),
        }
    }
}

/// One report: the domains' counters and the host's figures, read off the async threads.
pub async fn collect(agent: &Agent) -> anyhow::Result<NodeReport> {
    let hv = agent.hv.clone();
    let data_dir = agent.cfg.data_dir.clone();
    let (domains, host) =
        tokio::task::spawn_blocking(move || (hv.domain_stats(), HostSample::read(&data_dir)))
            .await?;
    Ok(NodeReport {
        interval_secs: agent.cfg.stats_interval.as_secs().max(1),
        host,
        domains: domains?,
        launchers: agent.launchers.protocol_versions().await,
    })
}
