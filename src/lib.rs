//! edgevirt: a single-binary virtualization appliance with a KubeVirt-compatible API.
//! `main.rs` parses the command line and calls into the role modules here.

pub mod store;
pub mod types;
pub mod virt;
pub mod launcher;
pub mod api;
pub mod client;
pub mod tls;
pub mod controller;
pub mod cpu;
pub mod agent;
pub mod server;
pub mod cli;
