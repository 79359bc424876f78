//! The images page: the site's disk images, kernels and ISOs, with their size and format;
//! an upload from the browser with a progress bar (the page's script sends the file to the
//! API's streaming upload with the session's CSRF token); delete.

use askama::Template;
use axum::extract::{Extension, Form, Path, Query, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;

use super::{Chrome, error_page, human_bytes, render, url_encode};
use crate::http::auth::Principal;
use crate::types::{Kind, age};
use crate::web::{Api, S, WebUser, api_message};

pub struct ImageRow {
    name: String,
    format: String,
    size: String,
    virtual_size: String,
    age: String,
    /// The DataVolume whose upload it holds, if any (deleted with it).
    owner: String,
}

#[derive(Template)]
#[template(path = "images.html")]
struct ImagesTpl {
    c: Chrome,
    images: Vec<ImageRow>,
}

#[derive(Deserialize)]
pub struct ImagesQuery {
    #[serde(default)]
    deleted: Option<String>,
    #[serde(default)]
    uploaded: Option<String>,
}

/// `GET /ui/images`
pub async fn images(
    State(st): S,
    Extension(u): Extension<WebUser>,
    Query(q): Query<ImagesQuery>,
) -> Response {
    let none = (Default::default(), Default::default());
    let list = match st.store.list(Kind::Image, None, &none.0, &none.1).await {
        Ok((l, _)) => l,
        Err(e) => return error_page(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    };
    let bytes = |v: &serde_json::Value| v.as_u64().map(human_bytes).unwrap_or("-".into());
    let images: Vec<ImageRow> = list
        .iter()
        .map(|i| ImageRow {
            name: i["metadata"]["name"].as_str().unwrap_or_default().into(),
            format: match (i["status"]["format"].as_str(), i["status"]["iso"].as_bool()) {
                (_, Some(true)) => "ISO".into(),
                (Some(f), _) => f.into(),
                (None, _) => "-".into(),
            },
            size: bytes(&i["status"]["sizeBytes"]),
            virtual_size: bytes(&i["status"]["virtualSizeBytes"]),
            age: i["metadata"]["creationTimestamp"]
                .as_str()
                .map(age)
                .unwrap_or("-".into()),
            owner: i["metadata"]["annotations"][crate::types::cdi::IMAGE_OWNER_ANNOTATION]
                .as_str()
                .unwrap_or_default()
                .into(),
        })
        .collect();
    // A confirmation names only what the list shows (or no longer shows).
    let has = |n: &str| images.iter().any(|i| i.name == n);
    let notice = match (q.uploaded, q.deleted) {
        (Some(n), _) if has(&n) => Some(format!("Image {n} uploaded and checked.")),
        (_, Some(n)) if !has(&n) => Some(format!("Image {n} deleted.")),
        _ => None,
    };
    render(&ImagesTpl {
        c: Chrome {
            notice,
            ..Chrome::new(&u, "Images")
        },
        images,
    })
}

#[derive(Deserialize)]
pub struct Nothing {}

/// `POST /ui/images/{name}/delete`: through the API, which refuses while a VM uses it.
pub async fn delete_image(
    Extension(p): Extension<Principal>,
    Extension(api): Extension<Api>,
    Path(name): Path<String>,
    Form(_): Form<Nothing>,
) -> Response {
    let uri = format!("/apis/edgevirt.io/v1/images/{}", url_encode(&name));
    let (code, v) = api
        .call(&p, Method::DELETE, &uri, "application/json", "{}")
        .await;
    if !code.is_success() {
        return error_page(code, &api_message(&v));
    }
    Redirect::to(&format!("/ui/images?deleted={}", url_encode(&name))).into_response()
}
