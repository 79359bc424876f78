//! The way to a Kubernetes cluster: `edgevirt crds` (CRDs generated from the Rust types),
//! `edgevirt export` (a site's VMs as clean KubeVirt manifests, with the Multus networks
//! they name) and `edgevirt kubeconfig`
//! (so `kubectl` talks to edgevirt today).

use anyhow::Context as _;
use clap::Args;
use kube::CustomResourceExt;
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{Value, json};

use super::ClientOpts;
use crate::types::{edgevirt, kubevirt};

#[derive(Args, Debug)]
pub struct CrdsArgs {
    /// Which API group's CRDs: `kubevirt.io` (a KubeVirt cluster already has these from its
    /// operator), `edgevirt.io`, or `all`.
    #[arg(long, default_value = "all", value_parser = ["all", "kubevirt.io", "edgevirt.io"])]
    group: String,
}

/// The CRDs as `apiextensions.k8s.io/v1` objects.
pub fn crd_documents(group: &str) -> Vec<Value> {
    let all = [
        kubevirt::VirtualMachine::crd(),
        kubevirt::VirtualMachineInstance::crd(),
        kubevirt::VirtualMachineInstanceMigration::crd(),
        edgevirt::Node::crd(),
        edgevirt::Image::crd(),
    ];
    all.into_iter()
        .filter(|c| group == "all" || c.spec.group == group)
        .map(|c| serde_json::to_value(c).expect("a CRD serializes"))
        .collect()
}

fn print_yaml_docs(docs: &[Value]) -> anyhow::Result<()> {
    for d in docs {
        print!("---\n{}", serde_yaml_ng::to_string(d)?);
    }
    Ok(())
}

pub fn crds(a: CrdsArgs) -> anyhow::Result<()> {
    print_yaml_docs(&crd_documents(&a.group))
}

#[derive(Args, Debug)]
pub struct ExportArgs {
    /// Only this namespace [default: all namespaces].
    #[arg(short, long)]
    namespace: Option<String>,
    #[command(flatten)]
    client: ClientOpts,
}

/// Annotations that mean something only to edgevirt or to one client's history.
fn local_annotation(key: &str) -> bool {
    key.starts_with("edgevirt.io/") || key == "kubectl.kubernetes.io/last-applied-configuration"
}

/// An object (a VM, a NetworkAttachmentDefinition) as a manifest for a cluster: kind, name,
/// namespace, labels, annotations and spec; no status, server-set metadata or edgevirt
/// bookkeeping. The metadata is read typed; the spec is exported as the server has it,
/// fields this release does not model included.
pub fn clean_manifest(vm: &Value) -> anyhow::Result<Value> {
    let m: ObjectMeta = match vm.get("metadata") {
        Some(m) => serde_json::from_value(m.clone()).context("metadata")?,
        None => ObjectMeta::default(),
    };
    let meta = ObjectMeta {
        name: m.name,
        namespace: m.namespace,
        labels: m.labels.filter(|l| !l.is_empty()),
        annotations: m
            .annotations
            .map(|a| {
                a.into_iter()
                    .filter(|(k, _)| !local_annotation(k))
                    .collect()
            })
            .filter(|a: &BTreeMap<String, String>| !a.is_empty()),
        ..Default::default()
    };
    Ok(json!({
        "apiVersion": vm["apiVersion"].as_str().unwrap_or("kubevirt.io/v1"),
        "kind": vm["kind"].as_str().unwrap_or("VirtualMachine"),
        "metadata": meta,
        "spec": vm.get("spec").cloned().unwrap_or(Value::Null),
    }))
}

pub async fn export(a: ExportArgs) -> anyhow::Result<()> {
    let c = a.client.client()?;
    let path = match &a.namespace {
        Some(ns) => format!("/apis/kubevirt.io/v1/namespaces/{ns}/virtualmachines"),
        None => "/apis/kubevirt.io/v1/virtualmachines".to_string(),
    };
    let list = c.get(&path).await?;
    let vms: Vec<Value> = list["items"].as_array().cloned().unwrap_or_default();
    // The NetworkAttachmentDefinitions the VMs' multus networks name come first: a cluster
    // (and edgevirt) refuses a VM whose network does not exist yet.
    let mut nads: Vec<(String, String)> = Vec::new();
    for vm in &vms {
        let ns = vm["metadata"]["namespace"].as_str().unwrap_or("default");
        let nets = vm["spec"]["template"]["spec"]["networks"].as_array();
        for n in nets.into_iter().flatten() {
            if let Some(name) = n["multus"]["networkName"].as_str() {
                let (nns, nad) = crate::types::cni::reference(ns, name);
                let key = (nns.to_string(), nad.to_string());
                if !nads.contains(&key) {
                    nads.push(key);
                }
            }
        }
    }
    let mut docs = Vec::new();
    for (ns, name) in &nads {
        let path = format!(
            "/apis/{}/v1/namespaces/{ns}/network-attachment-definitions/{name}",
            crate::types::cni::GROUP
        );
        match c.get_opt(&path).await? {
            Some(nad) => docs.push(clean_manifest(&nad)?),
            None => eprintln!("NetworkAttachmentDefinition {ns}/{name} is gone; not exported"),
        }
    }
    for vm in &vms {
        docs.push(clean_manifest(vm)?);
    }
    print_yaml_docs(&docs)
}

#[derive(Args, Debug)]
pub struct KubeconfigArgs {
    /// Name of the cluster, user and context in the file.
    #[arg(long, default_value = "edgevirt")]
    name: String,
    /// Namespace of the context.
    #[arg(short, long, default_value = "default")]
    namespace: String,
    #[command(flatten)]
    client: ClientOpts,
}

pub fn kubeconfig(a: KubeconfigArgs) -> anyhow::Result<()> {
    use base64::Engine;
    let s = a.client.settings()?;
    let mut cluster = json!({"server": s.server});
    if let Some(ca) = &s.ca_cert {
        let pem = std::fs::read(ca).with_context(|| format!("reading {}", ca.display()))?;
        cluster["certificate-authority-data"] =
            json!(base64::engine::general_purpose::STANDARD.encode(pem));
    } else if s.insecure {
        cluster["insecure-skip-tls-verify"] = json!(true);
    }
    let n = &a.name;
    let cfg = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": n, "cluster": cluster}],
        "users": [{"name": n, "user": {"token": s.token}}],
        "contexts": [{"name": n, "context": {"cluster": n, "user": n, "namespace": a.namespace}}],
        "current-context": n,
    });
    print!("{}", serde_yaml_ng::to_string(&cfg)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crds_are_valid_apiextensions_v1() {
        use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
        let docs = crd_documents("all");
        assert_eq!(docs.len(), 5);
        for d in &docs {
            // through YAML, as a cluster would read the printed text
            let text = serde_yaml_ng::to_string(d).unwrap();
            let crd: CustomResourceDefinition = serde_yaml_ng::from_str(&text).unwrap();
            assert_eq!(d["apiVersion"], "apiextensions.k8s.io/v1");
            let v = &crd.spec.versions[0];
            assert!(v.served && v.storage, "{}", crd.spec.names.kind);
            assert!(v.schema.as_ref().unwrap().open_api_v3_schema.is_some());
        }
        let vm = crd_documents("kubevirt.io");
        assert_eq!(vm.len(), 3);
        let crd: CustomResourceDefinition = serde_json::from_value(vm[0].clone()).unwrap();
        assert_eq!(
            crd.spec.names.short_names,
            Some(vec!["vm".to_string(), "vms".to_string()])
        );
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some("virtualmachines.kubevirt.io")
        );
    }

    #[test]
    fn export_drops_status_and_edgevirt_bookkeeping() {
        let vm = json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": "a", "namespace": "ns", "uid": "u", "resourceVersion": "7",
                "generation": 2, "creationTimestamp": "2026-01-02T03:04:05Z", "finalizers": ["edgevirt.io/volumes"],
                "labels": {"app": "a"},
                "annotations": {"edgevirt.io/volumes-node": "n", "team": "x",
                    "kubectl.kubernetes.io/last-applied-configuration": "{}"}},
            "spec": {"runStrategy": "Always", "fromANewerServer": {"k": 1}},
            "status": {"printableStatus": "Running"},
        });
        assert_eq!(
            clean_manifest(&vm).unwrap(),
            json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                "metadata": {"name": "a", "namespace": "ns", "labels": {"app": "a"},
                    "annotations": {"team": "x"}},
                "spec": {"runStrategy": "Always", "fromANewerServer": {"k": 1}}})
        );
        // Only edgevirt annotations: no empty annotations map.
        let bare = json!({"metadata": {"name": "b", "namespace": "ns",
            "annotations": {"edgevirt.io/volumes-node": "n"}, "labels": {}}, "spec": {}});
        assert_eq!(
            clean_manifest(&bare).unwrap(),
            json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                "metadata": {"name": "b", "namespace": "ns"}, "spec": {}})
        );
    }
}
