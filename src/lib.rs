//! edgevirt: a single-binary virtualization appliance with a KubeVirt-compatible API.
//! `main.rs` parses the command line and calls into the role modules here.

pub mod agent;
pub mod api;
pub mod cli;
pub mod client;
pub mod controller;
pub mod cpu;
pub mod hostnet;
pub mod http;
pub mod hypervisor;
pub mod launcher;
pub mod metrics;
pub mod registry;
pub mod rules;
pub mod server;
pub mod shell;
pub mod store;
pub mod tls;
pub mod types;
pub mod version;
pub mod virt;
pub mod vnc;
pub mod web;
