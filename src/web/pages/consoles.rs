//! The VNC and serial console pages.

use askama::Template;
use axum::extract::{Extension, Path, State};
use axum::http::{HeaderValue, header};
use axum::response::Response;

use super::{Chrome, load_vm, or_dash, printable_status, render, vmi_status};
use crate::http::AppState;
use crate::types::kubevirt::Phase;
use crate::web::{CSP_XTERM, S, WebUser};

#[derive(Template)]
#[template(path = "console.html")]
struct ConsoleTpl {
    c: Chrome,
    ns: String,
    name: String,
    running: bool,
    status: String,
}

#[derive(Template)]
#[template(path = "serial.html")]
struct SerialTpl {
    c: Chrome,
    ns: String,
    name: String,
    running: bool,
    status: String,
}

async fn console_common(
    st: &AppState,
    u: &WebUser,
    ns: &str,
    name: &str,
) -> Result<(bool, String), Response> {
    if let Some(refused) = super::viewer_refused(u, "open consoles") {
        return Err(refused);
    }
    let (_, vm, vmi) = load_vm(st, ns, name).await?;
    let running = vmi
        .as_ref()
        .is_some_and(|i| vmi_status(i).phase == Some(Phase::Running));
    Ok((running, or_dash(printable_status(&vm))))
}

pub async fn console(
    State(st): S,
    Extension(u): Extension<WebUser>,
    Path((ns, name)): Path<(String, String)>,
) -> Response {
    match console_common(&st, &u, &ns, &name).await {
        Ok((running, status)) => render(&ConsoleTpl {
            c: Chrome::new(&u, format!("Console of {name}")),
            ns,
            name,
            running,
            status,
        }),
        Err(r) => r,
    }
}

pub async fn serial(
    State(st): S,
    Extension(u): Extension<WebUser>,
    Path((ns, name)): Path<(String, String)>,
) -> Response {
    match console_common(&st, &u, &ns, &name).await {
        Ok((running, status)) => {
            let mut r = render(&SerialTpl {
                c: Chrome::new(&u, format!("Serial console of {name}")),
                ns,
                name,
                running,
                status,
            });
            r.headers_mut().insert(
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(CSP_XTERM),
            );
            r
        }
        Err(r) => r,
    }
}
