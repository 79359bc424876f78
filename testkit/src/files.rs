//! A plain HTTP server on loopback for the tests' download sources (a DataVolume's `http`
//! source): it serves the files of one folder by name, with their length, to `GET` only,
//! and answers 404 for anything else. One thread per connection; stopped when dropped.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

pub struct FileServer {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    stop: Arc<AtomicBool>,
    addr: std::net::SocketAddr,
}

impl FileServer {
    pub fn start(dir: PathBuf) -> FileServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let addr = listener.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stop2.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(mut conn) = conn else { continue };
                let dir = dir.clone();
                std::thread::spawn(move || {
                    let mut line = String::new();
                    let mut r = BufReader::new(conn.try_clone().unwrap());
                    if r.read_line(&mut line).is_err() {
                        return;
                    }
                    // The headers, up to the blank line.
                    let mut h = String::new();
                    while r.read_line(&mut h).is_ok_and(|n| n > 2) {
                        h.clear();
                    }
                    let mut words = line.split_whitespace();
                    let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
                    let name = path.trim_start_matches('/');
                    let file = (method == "GET" && !name.is_empty() && !name.contains(".."))
                        .then(|| dir.join(name))
                        .and_then(|p| std::fs::read(p).ok());
                    let _ = match file {
                        Some(body) => conn
                            .write_all(
                                format!(
                                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nContent-Type: \
                                     application/octet-stream\r\nConnection: close\r\n\r\n",
                                    body.len()
                                )
                                .as_bytes(),
                            )
                            .and_then(|()| conn.write_all(&body)),
                        None => conn.write_all(
                            b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                        ),
                    };
                });
            }
        });
        FileServer {
            url: format!("http://{addr}"),
            stop,
            addr,
        }
    }
}

impl Drop for FileServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = std::net::TcpStream::connect(self.addr);
    }
}
