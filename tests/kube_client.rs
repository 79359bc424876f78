//! A Kubernetes client library, kube-rs's `kube::Client`, against a real edgevirt server
//! (controller role over HTTPS, no libvirt needed: the VMs stay Halted): configured from the
//! kubeconfig `edgevirt kubeconfig` prints, then create, get, list, patch, watch (resumed from
//! a resourceVersion, and 410 Gone once that version is compacted away) and delete through
//! `Api<VirtualMachine>`.

use std::time::Duration;

use edgevirt::types::kubevirt::VirtualMachine;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::json;
use testkit::*;

async fn client_for(a: &Appliance, token: &str) -> kube::Client {
    let kc = Kubeconfig::from_yaml(&kubeconfig_yaml(a, token)).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .unwrap();
    kube::Client::try_from(cfg).unwrap()
}

/// A VM kube-rs sends as its typed object (Halted: nothing boots).
fn vm(name: &str) -> VirtualMachine {
    serde_json::from_value(Vm::halted(name, "k").label("suite", "kube-rs").json()).unwrap()
}

#[tokio::test]
async fn kube_client_crud_watch_and_gone() {
    let a = Appliance::start(&["--role", "controller", "--tls"]).await;
    assert!(a.url.starts_with("https://"), "{}", a.url);
    let (code, v) = a
        .call(
            reqwest::Method::PUT,
            "/apis/edgevirt.io/v1/images/k/upload",
            Some(("application/octet-stream", vec![0x55; 4096])),
        )
        .await;
    assert_eq!(code, 201, "{v}");
    let client = client_for(&a, &a.token).await;
    let vms: Api<VirtualMachine> = Api::namespaced(client.clone(), "default");

    // create, get, list
    let created = vms
        .create(&PostParams::default(), &vm("kr1"))
        .await
        .unwrap();
    let uid = created.metadata.uid.clone().unwrap();
    let got = vms.get("kr1").await.unwrap();
    assert_eq!(got.metadata.uid.as_deref(), Some(uid.as_str()));
    assert_eq!(
        got.spec.run_strategy.map(|s| format!("{s:?}")),
        Some("Halted".into())
    );
    vms.create(&PostParams::default(), &vm("kr2"))
        .await
        .unwrap();
    let list = vms
        .list(&ListParams::default().labels("suite=kube-rs"))
        .await
        .unwrap();
    let names: Vec<_> = list
        .items
        .iter()
        .filter_map(|v| v.metadata.name.clone())
        .collect();
    assert_eq!(names, ["kr1", "kr2"]);
    let page = vms.list(&ListParams::default().limit(1)).await.unwrap();
    assert_eq!(page.items.len(), 1);
    let rest = vms
        .list(
            &ListParams::default()
                .limit(1)
                .continue_token(page.metadata.continue_.as_deref().unwrap()),
        )
        .await
        .unwrap();
    assert_eq!(rest.items[0].metadata.name.as_deref(), Some("kr2"));
    let rv = list.metadata.resource_version.clone().unwrap();

    // patch (merge), then a watch resumed from the list's resourceVersion sees exactly it
    let patched = vms
        .patch(
            "kr1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"patched": "yes"}}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.metadata.labels.unwrap()["patched"], "yes");
    let mut w = vms
        .watch(&WatchParams::default().timeout(10), &rv)
        .await
        .unwrap()
        .boxed();
    // Events after `rv` only (the controller may write status too); the patch among them.
    let start = std::time::Instant::now();
    loop {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the patch never came"
        );
        let ev = tokio::time::timeout(Duration::from_secs(10), w.next())
            .await
            .expect("an event within 10 s")
            .unwrap()
            .unwrap();
        let o = match ev {
            WatchEvent::Modified(o) | WatchEvent::Added(o) => o,
            other => panic!("unexpected {other:?}"),
        };
        let orv: u64 = o
            .metadata
            .resource_version
            .as_deref()
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            orv > rv.parse::<u64>().unwrap(),
            "an event from before the resume point"
        );
        if o.metadata.name.as_deref() == Some("kr1")
            && o.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("patched"))
                .map(String::as_str)
                == Some("yes")
        {
            break;
        }
    }
    drop(w);

    // delete: gone from get
    vms.delete("kr2", &DeleteParams::default()).await.unwrap();
    wait_for("kr2 to be gone", Duration::from_secs(20), || async {
        matches!(vms.get("kr2").await, Err(kube::Error::Api(e)) if e.code == 404).then_some(())
    })
    .await;

    // Compact the event log (what the controller does as the log grows): watching from the
    // old version is then 410 Gone with a message that says what to do.
    let store = edgevirt::store::Store::open(&a.dir.join("edgevirt.db"))
        .await
        .unwrap();
    for i in 0..5 {
        vms.patch(
            "kr1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"n": i.to_string()}}})),
        )
        .await
        .unwrap();
    }
    assert!(store.prune_events_keep(1).await.unwrap() > 0);
    let gone = match vms.watch(&WatchParams::default().timeout(5), &rv).await {
        Err(kube::Error::Api(e)) => e,
        Ok(s) => match s.boxed().next().await {
            Some(Ok(WatchEvent::Error(e))) => e,
            Some(Err(kube::Error::Api(e))) => e,
            other => panic!("expected 410 Gone, got {other:?}"),
        },
        Err(e) => panic!("expected 410 Gone, got {e}"),
    };
    assert_eq!(gone.code, 410, "{gone:?}");
    assert!(
        gone.message.contains("list again") || gone.message.contains("too old"),
        "{}",
        gone.message
    );

    // A viewer's client reads but cannot write; a wrong token gets 401.
    let viewer = a.add_token("kv-viewer", "viewer").await;
    let ro: Api<VirtualMachine> = Api::namespaced(client_for(&a, &viewer).await, "default");
    assert_eq!(
        ro.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );
    match ro.create(&PostParams::default(), &vm("nope")).await {
        Err(kube::Error::Api(e)) => assert_eq!(e.code, 403, "{e:?}"),
        other => panic!("a viewer created a VM: {other:?}"),
    }
    // Secrets (what a containerDisk's imagePullSecret names): stringData is kept as base64
    // data, an admin reads them back, a viewer reads none.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    let config = r#"{"auths":{"registry.local:5000":{"auth":"dTpw"}}}"#;
    let mut s = Secret::default();
    s.metadata.name = Some("pull".into());
    s.type_ = Some("kubernetes.io/dockerconfigjson".into());
    s.string_data = Some([(".dockerconfigjson".to_string(), config.to_string())].into());
    secrets.create(&PostParams::default(), &s).await.unwrap();
    let back = secrets.get("pull").await.unwrap();
    assert_eq!(back.string_data, None, "stringData is folded into data");
    assert_eq!(
        back.data
            .as_ref()
            .and_then(|d| d.get(".dockerconfigjson"))
            .map(|b| b.0.clone()),
        Some(config.as_bytes().to_vec())
    );
    s.metadata.name = Some("broken".into());
    s.string_data = Some([(".dockerconfigjson".to_string(), "{nope".to_string())].into());
    match secrets.create(&PostParams::default(), &s).await {
        Err(kube::Error::Api(e)) => {
            assert_eq!(e.code, 422, "{e:?}");
            assert!(e.message.contains(".dockerconfigjson"), "{}", e.message);
        }
        other => panic!("a broken docker config was stored: {other:?}"),
    }
    let ro_secrets: Api<Secret> = Api::namespaced(client_for(&a, &viewer).await, "default");
    for r in [
        ro_secrets.get("pull").await.map(|_| ()),
        ro_secrets.list(&ListParams::default()).await.map(|_| ()),
    ] {
        match r {
            Err(kube::Error::Api(e)) => assert_eq!(e.code, 403, "{e:?}"),
            other => panic!("a viewer read a Secret: {other:?}"),
        }
    }
    secrets
        .delete("pull", &DeleteParams::default())
        .await
        .unwrap();
    let bad: Api<VirtualMachine> = Api::namespaced(client_for(&a, "wrong-token").await, "default");
    match bad.list(&ListParams::default()).await {
        Err(kube::Error::Api(e)) => assert_eq!(e.code, 401, "{e:?}"),
        other => panic!("a wrong token listed VMs: {other:?}"),
    }
    vms.delete("kr1", &DeleteParams::default()).await.unwrap();
}
