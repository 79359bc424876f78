//! Rules several roles share, so that no role imports another for them: whether a VMI can
//! live-migrate and how a migration's phase moves (controller and agent), when a node is
//! Ready (controller, API, dashboard, CLI), what a drain does with each VMI (CLI, dashboard), the join token's format (API and agent), where a
//! VMI's files live on a node (agent and console proxy), the install strategy (controller,
//! API, dashboard, CLI), and what the agent does inside a guest for its VMI (probes, access
//! credentials). Pure functions over objects: no store, no hypervisor, no HTTP.
//!
//! Finalizer, annotation and label names are vocabulary, not rules: they stay in
//! [`crate::types::annotations`].

pub mod actions;
pub mod cpus;
pub mod drain;
pub mod guest;
pub mod join;
pub mod migration;
pub mod network;
pub mod node;
pub mod paths;
pub mod placement;
