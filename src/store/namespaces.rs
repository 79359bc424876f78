//! Namespaces as a store invariant: `default` and every namespace an object is in exist as
//! Namespace objects.

use std::collections::BTreeSet;

use serde_json::json;

use super::{Error, FieldSelector, LabelSelector, Result, Store};
use crate::types::Kind;

impl Store {
    /// Create the Namespace objects that are missing: `default`, and those of stored
    /// objects (databases from before namespaces were stored get theirs here). Run at start.
    pub async fn ensure_namespaces(&self) -> Result<()> {
        let mut names = BTreeSet::from(["default".to_string()]);
        for kind in Kind::ALL.into_iter().filter(|k| k.namespaced()) {
            let (items, _) = self
                .list(
                    kind,
                    None,
                    &LabelSelector::default(),
                    &FieldSelector::default(),
                )
                .await?;
            names.extend(
                items
                    .iter()
                    .filter_map(|o| o.pointer("/metadata/namespace")?.as_str())
                    .map(str::to_string),
            );
        }
        for ns in names {
            if self.get(Kind::Namespace, "", &ns).await?.is_none() {
                let obj = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns},
                                 "status": {"phase": "Active"}});
                match self.create(Kind::Namespace, obj, false).await {
                    Ok(_) | Err(Error::AlreadyExists { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }
}
