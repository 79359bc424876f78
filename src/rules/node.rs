//! Node health as every role reads it: a node is Ready while its agent's heartbeats are
//! fresh and its Ready condition is True.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::types::Node;
use crate::types::kubevirt::{ConditionType, condition_true};

/// A node whose agent has not reported for this long is NotReady.
pub const NODE_LEASE: Duration = Duration::from_secs(40);

/// Whether a node object is Ready: a fresh heartbeat and a True Ready condition.
pub fn node_ready(node: &Node) -> bool {
    let Some(st) = &node.status else {
        return false;
    };
    let fresh = st
        .last_heartbeat_time
        .as_deref()
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
        .is_some_and(|t| {
            (Utc::now() - t.with_timezone(&Utc))
                .to_std()
                .map(|d| d < NODE_LEASE)
                .unwrap_or(true)
        });
    fresh && condition_true(&st.conditions, &ConditionType::Ready)
}
