//! Image import: a file streamed to the server, checked with `qemu-img info`, stored under
//! a name derived from a fresh uid. Images with a backing file or an external data file are
//! refused: they could make QEMU read any file on the host.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde_json::json;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use super::AppState;
use crate::http::auth::Principal;
use crate::http::error::{ApiError, ApiResult};
use crate::types::kubevirt::VirtualMachineSpec;
use crate::types::{Kind, check_name};

pub async fn upload(
    st: Arc<AppState>,
    p: Principal,
    name: &str,
    body: Body,
) -> ApiResult<Response> {
    check_name("image name", name)?;
    if st.store.get(Kind::Image, "", name).await?.is_some() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "AlreadyExists",
            format!("image {name:?} already exists; delete it first to replace it"),
        ));
    }
    let dir = st.images_dir();
    tokio::fs::create_dir_all(&dir)
        .await
        .map_err(ApiError::internal)?;
    let uid = uuid::Uuid::new_v4().to_string();
    let tmp = dir.join(format!(".upload-{uid}"));
    let mut file = tokio::fs::File::create(&tmp)
        .await
        .map_err(ApiError::internal)?;
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    let mut stream = body.into_data_stream();
    let result: Result<(), ApiError> = async {
        while let Some(chunk) = stream.next().await {
            let chunk =
                chunk.map_err(|e| ApiError::bad_request(format!("upload interrupted: {e}")))?;
            hasher.update(&chunk);
            size += chunk.len() as u64;
            file.write_all(&chunk).await.map_err(ApiError::internal)?;
        }
        file.sync_all().await.map_err(ApiError::internal)?;
        Ok(())
    }
    .await;
    if let Err(e) = result {
        let _ = tokio::fs::remove_file(&tmp).await;
        return Err(e);
    }
    if size == 0 {
        let _ = tokio::fs::remove_file(&tmp).await;
        return Err(ApiError::bad_request("the uploaded image is empty"));
    }
    let (format, vsize) = match crate::virt::image::inspect(&tmp, None).await {
        Ok(v) => v,
        Err(m) => {
            let _ = tokio::fs::remove_file(&tmp).await;
            return Err(ApiError::invalid(format!("image {name:?} refused: {m}")));
        }
    };
    let dest = dir.join(&uid);
    tokio::fs::rename(&tmp, &dest)
        .await
        .map_err(ApiError::internal)?;
    let obj = json!({
        "metadata": {"name": name, "uid": uid},
        "spec": {},
        "status": {
            "format": format,
            "sizeBytes": size,
            "virtualSizeBytes": vsize,
            "file": uid,
            "sha256": hex::encode(hasher.finalize()),
        }
    });
    match st.store.create(Kind::Image, obj, true).await {
        Ok(o) => {
            tracing::info!(image = %name, %format, size, user = %p.user, "imported image");
            Ok((StatusCode::CREATED, axum::Json(o)).into_response())
        }
        Err(e) => {
            let _ = tokio::fs::remove_file(&dest).await;
            Err(e.into())
        }
    }
}

pub async fn download(st: Arc<AppState>, name: &str) -> ApiResult<Response> {
    let img = st.store.must_get(Kind::Image, "", name).await?;
    let file = img["status"]["file"]
        .as_str()
        .ok_or_else(|| ApiError::internal("image has no file"))?;
    let f = tokio::fs::File::open(st.images_dir().join(file))
        .await
        .map_err(ApiError::internal)?;
    let stream = tokio_util::io::ReaderStream::new(f);
    Ok((
        [(header::CONTENT_TYPE, "application/octet-stream")],
        Body::from_stream(stream),
    )
        .into_response())
}

/// Refuse to delete an image a VM or VMI still uses (its overlays depend on it).
pub async fn check_unused(st: &AppState, name: &str) -> ApiResult<()> {
    let none = (Default::default(), Default::default());
    let (vms, _) = st
        .store
        .list(Kind::VirtualMachine, None, &none.0, &none.1)
        .await?;
    for vm in vms {
        if let Ok(spec) = serde_json::from_value::<VirtualMachineSpec>(vm["spec"].clone())
            && super::admission::referenced_images(&spec.template.spec)
                .iter()
                .any(|i| i == name)
        {
            return Err(ApiError::conflict(format!(
                "image {name:?} is used by VirtualMachine {}/{}; delete that VM first",
                vm["metadata"]["namespace"].as_str().unwrap_or(""),
                vm["metadata"]["name"].as_str().unwrap_or("")
            )));
        }
    }
    Ok(())
}
