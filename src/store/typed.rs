//! The store as the roles use it: typed objects in, typed objects out. Reads decode the
//! stored JSON tolerantly; an update hands the closure a typed object and writes back only
//! what it changed ([`crate::types::object::apply_change`]), so fields only a newer peer
//! knows stay as they were. The generic API paths (get, list, patch, watch) keep `Value`.

use serde_json::Value;

use super::{Error, FieldSelector, LabelSelector, Result, Store};
use crate::types::Typed;
use crate::types::object::apply_change;

impl Store {
    /// One object, typed.
    pub async fn get_typed<T: Typed>(&self, ns: &str, name: &str) -> Result<Option<T>> {
        self.get(T::KIND, ns, name)
            .await?
            .map(decode::<T>)
            .transpose()
    }

    /// Objects of a kind, typed. One that does not decode is logged and left out, so one
    /// bad object (a newer peer's, in a shape this release cannot read) does not stop the
    /// work on the others.
    pub async fn list_typed<T: Typed>(
        &self,
        ns: Option<&str>,
        labels: &LabelSelector,
        fields: &FieldSelector,
    ) -> Result<Vec<T>> {
        let (items, _) = self.list(T::KIND, ns, labels, fields).await?;
        Ok(items
            .into_iter()
            .filter_map(|v| match decode::<T>(v) {
                Ok(t) => Some(t),
                Err(e) => {
                    tracing::warn!(kind = T::KIND.name(), error = %e, "skipping an object that does not decode");
                    None
                }
            })
            .collect())
    }

    /// Every object of a kind, typed.
    pub async fn all<T: Typed>(&self) -> Result<Vec<T>> {
        self.list_typed(None, &LabelSelector::default(), &FieldSelector::default())
            .await
    }

    /// Read-modify-write one object, typed, in one transaction; `f` may refuse with an
    /// error, and then nothing changes. Only what `f` changed is written.
    pub async fn update_typed<T, F>(&self, ns: &str, name: &str, f: F) -> Result<T>
    where
        T: Typed,
        F: FnOnce(&mut T) -> Result<()>,
    {
        let v = self
            .update(T::KIND, ns, name, |stored| {
                let before = decode::<T>(stored.clone())?;
                let mut after = before.clone();
                f(&mut after)?;
                apply_change(stored, &before.to_value(), &after.to_value());
                Ok(())
            })
            .await?;
        decode(v)
    }

    /// Create an object from its typed form.
    pub async fn create_typed<T: Typed>(&self, obj: &T) -> Result<T> {
        decode(self.create(T::KIND, obj.to_value(), false).await?)
    }
}

fn decode<T: Typed>(v: Value) -> Result<T> {
    T::from_value(v).map_err(|e| Error::Invalid(e.0))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::types::kubevirt::{Phase, VirtualMachineInstance};
    use crate::types::{Kind, Meta};

    #[tokio::test]
    async fn typed_updates_keep_unknown_fields_and_skip_idle_writes() {
        let d = tempfile::tempdir().unwrap();
        let store = Store::open(&d.path().join("db")).await.unwrap();
        store
            .create(
                Kind::VirtualMachineInstance,
                json!({"metadata": {"name": "a", "namespace": "default"},
                       "spec": {"domain": {"devices": {}}, "fromTheFuture": 1},
                       "status": {"phase": "Scheduled", "alsoNew": {"k": "v"}}}),
                false,
            )
            .await
            .unwrap();
        let vmi: VirtualMachineInstance = store.get_typed("default", "a").await.unwrap().unwrap();
        assert_eq!(vmi.status.as_ref().unwrap().phase, Some(Phase::Scheduled));
        let rv = vmi.metadata.resource_version.clone();

        // Nothing changed: no write, same resourceVersion.
        let same: VirtualMachineInstance = store
            .update_typed("default", "a", |_: &mut VirtualMachineInstance| Ok(()))
            .await
            .unwrap();
        assert_eq!(same.metadata.resource_version, rv);

        let after = store
            .update_typed("default", "a", |v: &mut VirtualMachineInstance| {
                v.status.get_or_insert_default().phase = Some(Phase::Running);
                Ok(())
            })
            .await
            .unwrap();
        assert_ne!(after.metadata.resource_version, rv);
        assert_eq!(after.name(), "a");
        let raw = store
            .get(Kind::VirtualMachineInstance, "default", "a")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(raw["status"]["phase"], "Running");
        assert_eq!(raw["status"]["alsoNew"]["k"], "v");
        assert_eq!(raw["spec"]["fromTheFuture"], 1);
    }
}
