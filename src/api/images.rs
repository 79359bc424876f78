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
use crate::types::{Kind, Meta, check_name};

/// What the uploader says an image is (`?type=` on the upload), checked once all of it
/// has arrived.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Declared {
    /// Whatever `qemu-img` reads: a disk, a kernel, an initrd or an ISO.
    #[default]
    Any,
    /// A CD or DVD image (`type=iso`): anything else is refused.
    Iso,
}

impl Declared {
    /// From an upload's query string: `type=iso`, `type=disk` (the same as none), nothing
    /// else.
    pub fn from_query(query: Option<&str>) -> ApiResult<Declared> {
        let pairs: Vec<(String, String)> = serde_urlencoded::from_str(query.unwrap_or(""))
            .map_err(|e| ApiError::bad_request(format!("invalid query: {e}")))?;
        let mut declared = Declared::Any;
        for (k, v) in pairs {
            match (k.as_str(), v.as_str()) {
                ("type", "iso") => declared = Declared::Iso,
                ("type", "disk") => declared = Declared::Any,
                ("type", other) => {
                    return Err(ApiError::bad_request(format!(
                        "type {other:?} is not an image type: use iso or disk"
                    )));
                }
                _ => {}
            }
        }
        Ok(declared)
    }
}

pub async fn upload(
    st: Arc<AppState>,
    p: Principal,
    name: &str,
    declared: Declared,
    headers: &axum::http::HeaderMap,
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
    if let Some(range) = headers.get(header::CONTENT_RANGE) {
        let range = range.to_str().unwrap_or_default().to_string();
        let r = upload_part(&st, name, declared, &range, body).await?;
        if r.status() == StatusCode::CREATED {
            tracing::info!(image = %name, user = %p.user, "imported image (resumable upload)");
        }
        return Ok(r);
    }
    let o = store_image(&st, name, json!({}), declared, body).await?;
    let status = &o["status"];
    tracing::info!(image = %name, format = %status["format"], size = %status["sizeBytes"], user = %p.user, "imported image");
    Ok((StatusCode::CREATED, axum::Json(o)).into_response())
}

/// `PUT .../datavolumes/{name}/upload`: the disk image of an `upload` DataVolume (what
/// `edgevirt image upload` sends, as CDI's `virtctl image-upload`). It is kept as an image
/// the DataVolume's annotation names, and the node that runs the first VM using the
/// DataVolume fills its disk from it. Once only: a DataVolume's data does not change.
pub async fn upload_data_volume(
    st: Arc<AppState>,
    p: Principal,
    ns: &str,
    name: &str,
    body: Body,
) -> ApiResult<Response> {
    use crate::types::cdi::{
        DataVolume, Fill, IMAGE_OWNER_ANNOTATION, UPLOAD_IMAGE_ANNOTATION, phase,
    };
    check_name("namespace", ns)?;
    check_name("name", name)?;
    let dv: DataVolume = st
        .store
        .get_typed(ns, name)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("DataVolume {ns}/{name} not found")))?;
    if dv.spec.fill(ns) != Some(Fill::Upload) {
        return Err(ApiError::invalid(format!(
            "DataVolume {ns}/{name} does not take an upload: its source is not `upload`"
        )));
    }
    if dv.deleting() || dv.annotation(UPLOAD_IMAGE_ANNOTATION).is_some() {
        return Err(ApiError::conflict(format!(
            "DataVolume {ns}/{name} already has its data (or is being deleted); create \
             another DataVolume to upload another image"
        )));
    }
    let image = format!("dv-{}", dv.uid());
    let size = dv.spec.size().unwrap_or(0);
    let meta = json!({"annotations": {IMAGE_OWNER_ANNOTATION: format!("{ns}/{name}")}});
    let o = store_image(&st, &image, meta, Declared::Any, body).await?;
    let vsize = o["status"]["virtualSizeBytes"].as_u64().unwrap_or(0);
    let refuse = if vsize > size {
        Some(format!(
            "the image's virtual size ({vsize} bytes) is larger than the storage DataVolume \
             {ns}/{name} asks for ({size} bytes)"
        ))
    } else {
        None
    };
    let marked = match &refuse {
        Some(_) => Ok(()),
        None => st
            .store
            .update_typed(ns, name, |d: &mut DataVolume| {
                if d.annotation(UPLOAD_IMAGE_ANNOTATION).is_some() {
                    return Err(crate::store::Error::Conflict);
                }
                d.metadata
                    .annotations
                    .get_or_insert_default()
                    .insert(UPLOAD_IMAGE_ANNOTATION.into(), image.clone());
                let st = d.status.get_or_insert_default();
                st.phase = Some(phase::WAIT_FOR_FIRST_CONSUMER.into());
                Ok(())
            })
            .await
            .map(drop),
    };
    if refuse.is_some() || marked.is_err() {
        // Nothing of a refused upload stays.
        if let Some(file) = o["status"]["file"].as_str() {
            let _ = tokio::fs::remove_file(st.images_dir().join(file)).await;
        }
        let _ = st.store.delete(Kind::Image, "", &image, None).await;
        if let Some(m) = refuse {
            return Err(ApiError::invalid(m));
        }
        marked?;
    }
    tracing::info!(namespace = %ns, datavolume = %name, %image, size = %o["status"]["sizeBytes"], user = %p.user, "uploaded the data of a DataVolume");
    Ok((StatusCode::CREATED, axum::Json(o)).into_response())
}

/// Remove image files no image names (those of images deleted without the API: the
/// uploads of DataVolumes that are gone), and uploads interrupted over a day ago (resumable
/// ones too: a day to resume).
async fn sweep(st: &AppState) {
    let Ok(images) = st.store.all::<crate::types::edgevirt::Image>().await else {
        return;
    };
    let files: std::collections::HashSet<String> = images
        .iter()
        .filter_map(|i| i.status.as_ref().map(|s| s.file.clone()))
        .collect();
    let Ok(mut entries) = tokio::fs::read_dir(st.images_dir()).await else {
        return;
    };
    while let Ok(Some(e)) = entries.next_entry().await {
        let name = e.file_name().to_string_lossy().into_owned();
        let is_file = e.file_type().await.is_ok_and(|t| t.is_file());
        let stale_upload = (name.starts_with(".upload-") || name.starts_with(".partial-"))
            && e.metadata()
                .await
                .ok()
                .and_then(|m| m.modified().ok())
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > std::time::Duration::from_secs(86_400));
        let orphan = !name.starts_with('.') && uuid::Uuid::parse_str(&name).is_ok();
        if is_file && (stale_upload || (orphan && !files.contains(&name))) {
            let _ = tokio::fs::remove_file(e.path()).await;
            tracing::info!(file = %name, "removed an image file no image names");
        }
    }
}

/// Stream an upload to a file, check it, and create the image `name` with `meta` added
/// to its metadata; the stored object.
async fn store_image(
    st: &AppState,
    name: &str,
    meta: serde_json::Value,
    declared: Declared,
    body: Body,
) -> ApiResult<serde_json::Value> {
    sweep(st).await;
    let dir = st.images_dir();
    tokio::fs::create_dir_all(&dir)
        .await
        .map_err(ApiError::internal)?;
    let uid = uuid::Uuid::new_v4().to_string();
    let tmp = dir.join(format!(".upload-{uid}"));
    let file = tokio::fs::File::create(&tmp)
        .await
        .map_err(ApiError::internal)?;
    // The body comes in chunks of a few KiB: written a MiB at a time.
    let mut out = tokio::io::BufWriter::with_capacity(WRITE_BUFFER, file);
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    let mut stream = body.into_data_stream();
    let result: Result<(), ApiError> = async {
        while let Some(chunk) = stream.next().await {
            let chunk =
                chunk.map_err(|e| ApiError::bad_request(format!("upload interrupted: {e}")))?;
            hasher.update(&chunk);
            size += chunk.len() as u64;
            out.write_all(&chunk).await.map_err(ApiError::internal)?;
        }
        out.flush().await.map_err(ApiError::internal)?;
        out.get_ref().sync_all().await.map_err(ApiError::internal)?;
        Ok(())
    }
    .await;
    if let Err(e) = result {
        let _ = tokio::fs::remove_file(&tmp).await;
        return Err(e);
    }
    let got = Received {
        tmp,
        uid,
        size,
        sha256: hex::encode(hasher.finalize()),
    };
    finish_image(st, name, meta, got, declared).await
}

/// How much of an upload is gathered before it is written to its file.
const WRITE_BUFFER: usize = 1 << 20;

/// An upload received whole, in a temporary file of the images folder.
struct Received {
    tmp: std::path::PathBuf,
    /// The image's uid, which names its file.
    uid: String,
    size: u64,
    sha256: String,
}

/// Check a fully received upload (an ISO if `declared` says so), move it to its place and
/// create the image object; nothing of it stays when anything fails.
async fn finish_image(
    st: &AppState,
    name: &str,
    meta: serde_json::Value,
    got: Received,
    declared: Declared,
) -> ApiResult<serde_json::Value> {
    let Received {
        tmp,
        uid,
        size,
        sha256,
    } = got;
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
    let iso = format == "raw" && crate::virt::image::is_iso(&tmp);
    if declared == Declared::Iso && !iso {
        let _ = tokio::fs::remove_file(&tmp).await;
        return Err(ApiError::invalid(format!(
            "image {name:?} refused: it is not an ISO image (no ISO 9660 or UDF volume \
             descriptor at byte 32768; it reads as a {format} disk). Import a disk image \
             without type=iso"
        )));
    }
    let dest = st.images_dir().join(&uid);
    tokio::fs::rename(&tmp, &dest)
        .await
        .map_err(ApiError::internal)?;
    let mut obj = json!({
        "metadata": {"name": name, "uid": uid},
        "spec": {},
        "status": {
            "format": format,
            "sizeBytes": size,
            "virtualSizeBytes": vsize,
            "file": uid,
            "sha256": sha256,
            "iso": iso,
        }
    });
    if let Some(m) = meta.as_object() {
        for (k, v) in m {
            obj["metadata"][k] = v.clone();
        }
    }
    match st.store.create(Kind::Image, obj, true).await {
        Ok(o) => Ok(o),
        Err(e) => {
            let _ = tokio::fs::remove_file(&dest).await;
            Err(e.into())
        }
    }
}

// ------------------------------------------------------------ resumable uploads

/// The largest image a resumable upload takes.
const MAX_UPLOAD: u64 = 4 << 40;

/// Image names with a part being written now: one writer per partial upload.
static WRITING: std::sync::LazyLock<std::sync::Mutex<std::collections::HashSet<String>>> =
    std::sync::LazyLock::new(Default::default);

struct Writing(String);
impl Drop for Writing {
    fn drop(&mut self) {
        WRITING
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.0);
    }
}

/// Where the received part of a resumable upload of `name` is kept (the name is a DNS
/// label, checked before).
fn partial_path(st: &AppState, name: &str) -> std::path::PathBuf {
    st.images_dir().join(format!(".partial-{name}"))
}

/// `bytes START-END/TOTAL` (END inclusive), as HTTP's Content-Range.
fn parse_content_range(v: &str) -> Option<(u64, u64, u64)> {
    let (range, total) = v.strip_prefix("bytes ")?.split_once('/')?;
    let (start, end) = range.split_once('-')?;
    let (start, end, total): (u64, u64, u64) =
        (start.parse().ok()?, end.parse().ok()?, total.parse().ok()?);
    (start <= end && end < total).then_some((start, end, total))
}

/// How much of a resumable upload the server has, as `{"receivedBytes": N}` (0: none).
pub async fn upload_offset(st: Arc<AppState>, name: &str) -> ApiResult<Response> {
    check_name("image name", name)?;
    let have = tokio::fs::metadata(partial_path(&st, name))
        .await
        .map(|m| m.len())
        .unwrap_or(0);
    Ok(axum::Json(json!({"receivedBytes": have})).into_response())
}

/// One part of a resumable upload (`Content-Range: bytes START-END/TOTAL`): appended to
/// what the server has, which must end at START (else 409 saying where it ends); the last
/// part checks the whole image and creates it (201), earlier ones answer 200 with the
/// bytes received so far. A part cut off keeps what arrived: ask `GET .../upload` and go
/// on from there.
async fn upload_part(
    st: &AppState,
    name: &str,
    declared: Declared,
    range: &str,
    body: Body,
) -> ApiResult<Response> {
    let Some((start, end, total)) = parse_content_range(range) else {
        return Err(ApiError::bad_request(format!(
            "Content-Range {range:?} is not `bytes START-END/TOTAL` with START <= END < TOTAL"
        )));
    };
    if total > MAX_UPLOAD {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "RequestEntityTooLarge",
            format!("an image may have at most {MAX_UPLOAD} bytes, not {total}"),
        ));
    }
    let _writing = {
        let mut w = WRITING.lock().unwrap_or_else(|e| e.into_inner());
        if !w.insert(name.to_string()) {
            return Err(ApiError::conflict(format!(
                "another part of image {name:?} is being received; wait for it"
            )));
        }
        Writing(name.to_string())
    };
    sweep(st).await;
    tokio::fs::create_dir_all(st.images_dir())
        .await
        .map_err(ApiError::internal)?;
    let path = partial_path(st, name);
    let have = tokio::fs::metadata(&path)
        .await
        .map(|m| m.len())
        .unwrap_or(0);
    if start != have {
        let mut r = ApiError::conflict(format!(
            "the server has {have} bytes of image {name:?}: send from byte {have}, not {start}"
        ))
        .into_response();
        r.headers_mut().insert("upload-offset", have.into());
        return Ok(r);
    }
    let file = tokio::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .await
        .map_err(ApiError::internal)?;
    let mut out = tokio::io::BufWriter::with_capacity(WRITE_BUFFER, file);
    let want = end - start + 1;
    // Bytes of this part taken (buffered or written): only whole chunks within the range.
    let mut written = 0u64;
    let mut stream = body.into_data_stream();
    let result: Result<(), ApiError> = async {
        while let Some(chunk) = stream.next().await {
            let chunk =
                chunk.map_err(|e| ApiError::bad_request(format!("upload interrupted: {e}")))?;
            if written + chunk.len() as u64 > want {
                return Err(ApiError::bad_request(format!(
                    "the part is longer than its Content-Range says ({want} bytes)"
                )));
            }
            out.write_all(&chunk).await.map_err(ApiError::internal)?;
            written += chunk.len() as u64;
        }
        out.flush().await.map_err(ApiError::internal)?;
        out.get_ref().sync_all().await.map_err(ApiError::internal)?;
        Ok(())
    }
    .await;
    if let Err(e) = result {
        // What arrived within the range stays: the client resumes after it. When what was
        // buffered cannot be written, the file goes back to where this part started.
        let keep = if out.flush().await.is_ok() {
            have + written
        } else {
            have
        };
        let file = out.into_inner();
        let _ = file.set_len(keep).await;
        let _ = file.sync_all().await;
        return Err(e);
    }
    let file = out.into_inner();
    if written != want {
        return Err(ApiError::bad_request(format!(
            "the part has {written} bytes, its Content-Range says {want}; {} bytes are kept",
            have + written
        )));
    }
    drop(file);
    if end + 1 < total {
        return Ok(
            axum::Json(json!({"receivedBytes": end + 1, "totalBytes": total})).into_response(),
        );
    }
    // The last part: the whole image is here.
    let uid = uuid::Uuid::new_v4().to_string();
    let tmp = st.images_dir().join(format!(".upload-{uid}"));
    tokio::fs::rename(&path, &tmp)
        .await
        .map_err(ApiError::internal)?;
    let sha256 = {
        let tmp = tmp.clone();
        tokio::task::spawn_blocking(move || -> std::io::Result<String> {
            let mut f = std::fs::File::open(tmp)?;
            let mut h = Sha256::new();
            std::io::copy(&mut f, &mut h)?;
            Ok(hex::encode(h.finalize()))
        })
        .await
        .map_err(ApiError::internal)?
        .map_err(ApiError::internal)?
    };
    let got = Received {
        tmp,
        uid,
        size: total,
        sha256,
    };
    let o = finish_image(st, name, json!({}), got, declared).await?;
    Ok((StatusCode::CREATED, axum::Json(o)).into_response())
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

#[cfg(test)]
mod tests {
    use super::parse_content_range;

    #[test]
    fn content_ranges_are_start_end_total() {
        assert_eq!(parse_content_range("bytes 0-9/10"), Some((0, 9, 10)));
        assert_eq!(parse_content_range("bytes 5-5/6"), Some((5, 5, 6)));
        for bad in [
            "bytes 0-10/10",
            "bytes 5-4/10",
            "bytes */10",
            "0-9/10",
            "bytes 0-9/x",
            "bytes -1-9/10",
        ] {
            assert_eq!(parse_content_range(bad), None, "{bad}");
        }
    }
}
