//! The storage view: where VM data lives on each node (its data folder, the shared pool)
//! with size and free space, the DataVolumes with their size and place, and which VM uses
//! which disk.

use askama::Template;
use axum::extract::{Extension, State};
use axum::response::Response;

use super::{Chrome, all, human_bytes, render};
use crate::types::Meta;
use crate::types::cdi::{DataVolume, NODE_ANNOTATION};
use crate::types::edgevirt::Node;
use crate::types::kubevirt::{VirtualMachine, Volume};
use crate::web::{S, WebUser};

pub struct PlaceRow {
    node: String,
    name: String,
    path: String,
    size: String,
    free: String,
    /// Used share, 0-100, for the bar.
    used_pct: u64,
    low: bool,
}

pub struct VolumeRow {
    vm: String,
    link: String,
    volume: String,
    kind: &'static str,
    source: String,
    place: String,
}

pub struct DataVolumeRow {
    name: String,
    size: String,
    class: String,
    place: String,
    phase: String,
}

#[derive(Template)]
#[template(path = "storage.html")]
struct StorageTpl {
    c: Chrome,
    places: Vec<PlaceRow>,
    data_volumes: Vec<DataVolumeRow>,
    volumes: Vec<VolumeRow>,
}

/// Under this share free, a place is marked as running low.
const LOW_FREE_PCT: u64 = 10;

/// A VM volume's kind and what it takes its data from.
fn describe(v: &Volume) -> Option<(&'static str, String)> {
    Some(if let Some(d) = &v.data_volume {
        ("DataVolume", d.name.clone())
    } else if let Some(c) = &v.persistent_volume_claim {
        ("claim (shared pool)", c.claim_name.clone())
    } else if let Some(c) = &v.container_disk {
        ("image (copy-on-write)", c.image.clone())
    } else if let Some(h) = &v.host_disk {
        ("host disk", h.path.clone())
    } else if v.empty_disk.is_some() {
        ("empty disk", "scratch, gone when the VM stops".into())
    } else {
        return None; // cloud-init, config maps and secrets hold no disk data
    })
}

/// `GET /ui/storage`
pub async fn storage(State(st): S, Extension(u): Extension<WebUser>) -> Response {
    let (nodes, vms, dvs) = match tokio::try_join!(
        all::<Node>(&st),
        all::<VirtualMachine>(&st),
        all::<DataVolume>(&st)
    ) {
        Ok(x) => x,
        Err(r) => return r,
    };
    let places = nodes
        .iter()
        .flat_map(|n| {
            let facts = n
                .status
                .as_ref()
                .map(|s| s.storage.clone())
                .unwrap_or_default();
            facts.into_iter().map(move |f| {
                let used = f.capacity_bytes.saturating_sub(f.free_bytes);
                let used_pct = (used * 100).checked_div(f.capacity_bytes).unwrap_or(0);
                PlaceRow {
                    node: n.name().to_string(),
                    name: if f.name == "local" {
                        "data folder (local)".into()
                    } else {
                        format!("shared pool {}", f.name)
                    },
                    path: f.path,
                    size: human_bytes(f.capacity_bytes),
                    free: human_bytes(f.free_bytes),
                    low: f.capacity_bytes > 0 && 100 - used_pct < LOW_FREE_PCT,
                    used_pct,
                }
            })
        })
        .collect();
    let place_of = |dv: &DataVolume| match dv.annotation(NODE_ANNOTATION) {
        Some(n) => format!("node {n}"),
        None if dv.spec.storage_class() != crate::types::cdi::LOCAL_CLASS => {
            format!("shared pool {}", dv.spec.storage_class())
        }
        None => "not placed yet (filled where its VM first runs)".into(),
    };
    let volumes = vms
        .iter()
        .flat_map(|vm| {
            vm.spec.template.spec.volumes.iter().filter_map(|v| {
                let (kind, source) = describe(v)?;
                let place = match kind {
                    "DataVolume" => dvs
                        .iter()
                        .find(|d| d.namespace() == vm.namespace() && d.name() == source)
                        .map(place_of)
                        .unwrap_or_else(|| "-".into()),
                    "claim (shared pool)" => "shared pool".into(),
                    "host disk" => "its node's host-disk folder".into(),
                    _ => "the node running it".into(),
                };
                Some(VolumeRow {
                    vm: format!("{}/{}", vm.namespace(), vm.name()),
                    link: super::detail_url(vm.namespace(), vm.name()),
                    volume: v.name.clone(),
                    kind,
                    source,
                    place,
                })
            })
        })
        .collect();
    let data_volumes = dvs
        .iter()
        .map(|d| DataVolumeRow {
            name: format!("{}/{}", d.namespace(), d.name()),
            size: d.spec.size().map(human_bytes).unwrap_or_else(|| "-".into()),
            class: d.spec.storage_class().to_string(),
            place: place_of(d),
            phase: d
                .status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_else(|| "-".into()),
        })
        .collect();
    render(&StorageTpl {
        c: Chrome::new(&u, "Storage"),
        places,
        data_volumes,
        volumes,
    })
}
