//! The client half of RFB (RFC 6143), as far as the console proxy needs it: enough framing
//! of what a viewer sends to drop input events from viewers who do not hold control, and to
//! force the shared flag so that one viewer never disconnects the others. Everything is
//! forwarded byte for byte otherwise; the server half is never parsed.

use bytes::{Buf, BytesMut};

#[derive(Debug, PartialEq, Eq)]
enum State {
    /// "RFB 003.00x\n" from the client.
    Version,
    /// The security type the client picked (3.7 and later).
    SecurityChoice,
    /// The 16-byte VNC authentication response.
    VncAuthResponse,
    /// ClientInit: one byte, the shared flag.
    ClientInit,
    Messages,
}

/// What a viewer's stream turned into.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Filtered {
    /// Bytes to write to the VNC server.
    pub forward: Vec<u8>,
    /// Input messages dropped because the viewer has no control.
    pub dropped: usize,
}

/// Frames the client → server direction of one RFB connection.
#[derive(Debug)]
pub struct ClientFilter {
    state: State,
    buf: BytesMut,
}

impl Default for ClientFilter {
    fn default() -> Self {
        Self::new()
    }
}

/// Message types a viewer sends (RFC 6143 §7.5 plus the common extensions).
mod msg {
    pub const SET_PIXEL_FORMAT: u8 = 0;
    pub const SET_ENCODINGS: u8 = 2;
    pub const FRAMEBUFFER_UPDATE_REQUEST: u8 = 3;
    pub const KEY_EVENT: u8 = 4;
    pub const POINTER_EVENT: u8 = 5;
    pub const CLIENT_CUT_TEXT: u8 = 6;
    pub const ENABLE_CONTINUOUS_UPDATES: u8 = 150;
    pub const CLIENT_FENCE: u8 = 248;
    pub const SET_DESKTOP_SIZE: u8 = 251;
    pub const XVP: u8 = 250;
    pub const QEMU: u8 = 255;
}

impl ClientFilter {
    pub fn new() -> Self {
        ClientFilter {
            state: State::Version,
            buf: BytesMut::new(),
        }
    }

    /// Take what the viewer sent; return what goes on to the server. `control`: whether this
    /// viewer may send input. Err: the stream is not RFB as we know it (close the connection).
    pub fn feed(&mut self, data: &[u8], control: bool) -> Result<Filtered, String> {
        self.buf.extend_from_slice(data);
        let mut out = Filtered::default();
        loop {
            match self.state {
                State::Version => {
                    if self.buf.len() < 12 {
                        break;
                    }
                    let v = self.buf.split_to(12);
                    if !v.starts_with(b"RFB 003.") || v[11] != b'\n' {
                        return Err("the viewer did not start with an RFB version".into());
                    }
                    let minor = std::str::from_utf8(&v[8..11])
                        .ok()
                        .and_then(|m| m.parse::<u32>().ok())
                        .ok_or("bad RFB version")?;
                    out.forward.extend_from_slice(&v);
                    // 3.3: the server picks the security type, the client sends nothing.
                    self.state = if minor >= 7 {
                        State::SecurityChoice
                    } else {
                        State::ClientInit
                    };
                }
                State::SecurityChoice => {
                    if self.buf.is_empty() {
                        break;
                    }
                    let t = self.buf.get_u8();
                    out.forward.push(t);
                    self.state = match t {
                        1 => State::ClientInit,
                        2 => State::VncAuthResponse,
                        other => return Err(format!("security type {other} is not supported")),
                    };
                }
                State::VncAuthResponse => {
                    if self.buf.len() < 16 {
                        break;
                    }
                    out.forward.extend_from_slice(&self.buf.split_to(16));
                    self.state = State::ClientInit;
                }
                State::ClientInit => {
                    if self.buf.is_empty() {
                        break;
                    }
                    self.buf.advance(1);
                    // Always shared: an exclusive viewer would disconnect everyone else.
                    out.forward.push(1);
                    self.state = State::Messages;
                }
                State::Messages => {
                    let Some(len) = message_len(&self.buf)? else {
                        break;
                    };
                    let m = self.buf.split_to(len);
                    if control || !is_input(&m) {
                        out.forward.extend_from_slice(&m);
                    } else {
                        out.dropped += 1;
                    }
                }
            }
        }
        Ok(out)
    }
}

/// Input, i.e. what a view-only viewer may not send.
fn is_input(m: &[u8]) -> bool {
    match m[0] {
        msg::KEY_EVENT
        | msg::POINTER_EVENT
        | msg::CLIENT_CUT_TEXT
        | msg::SET_DESKTOP_SIZE
        | msg::XVP => true,
        // QEMU extended key event
        msg::QEMU => m[1] == 0,
        _ => false,
    }
}

fn be16(b: &[u8], at: usize) -> usize {
    u16::from_be_bytes([b[at], b[at + 1]]) as usize
}

/// Length of the complete message at the start of `b`, None when more bytes are needed.
fn message_len(b: &[u8]) -> Result<Option<usize>, String> {
    let Some(&t) = b.first() else {
        return Ok(None);
    };
    // (fixed header length, extra length once the header is there)
    let need = |header: usize, extra: &dyn Fn(&[u8]) -> usize| -> Option<usize> {
        if b.len() < header {
            return None;
        }
        let total = header + extra(b);
        (b.len() >= total).then_some(total)
    };
    let n = match t {
        msg::SET_PIXEL_FORMAT => need(20, &|_| 0),
        msg::SET_ENCODINGS => need(4, &|b| 4 * be16(b, 2)),
        msg::FRAMEBUFFER_UPDATE_REQUEST => need(10, &|_| 0),
        msg::KEY_EVENT => need(8, &|_| 0),
        msg::POINTER_EVENT => need(6, &|_| 0),
        msg::CLIENT_CUT_TEXT => need(8, &|b| {
            // A negative length is the extended-clipboard form; its size is the magnitude.
            let l = i32::from_be_bytes([b[4], b[5], b[6], b[7]]);
            l.unsigned_abs() as usize
        }),
        msg::ENABLE_CONTINUOUS_UPDATES => need(10, &|_| 0),
        msg::CLIENT_FENCE => need(9, &|b| b[8] as usize),
        msg::SET_DESKTOP_SIZE => need(8, &|b| 16 * b[6] as usize),
        msg::XVP => need(4, &|_| 0),
        msg::QEMU => {
            if b.len() < 2 {
                return Ok(None);
            }
            match b[1] {
                0 => need(12, &|_| 0),
                1 => {
                    if b.len() < 4 {
                        return Ok(None);
                    }
                    match be16(b, 2) {
                        0 | 1 => need(4, &|_| 0),
                        2 => need(10, &|_| 0),
                        o => return Err(format!("unknown QEMU audio message {o}")),
                    }
                }
                o => return Err(format!("unknown QEMU client message {o}")),
            }
        }
        other => return Err(format!("unknown RFB client message type {other}")),
    };
    if let Some(n) = n
        && n > 16 << 20
    {
        return Err("an RFB client message larger than 16 MiB".into());
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handshake(f: &mut ClientFilter) -> Vec<u8> {
        f.feed(b"RFB 003.008\n\x01\x00", false).unwrap().forward
    }

    #[test]
    fn forces_shared_flag_and_passes_handshake() {
        let mut f = ClientFilter::new();
        assert_eq!(handshake(&mut f), b"RFB 003.008\n\x01\x01");
    }

    #[test]
    fn old_clients_send_no_security_choice() {
        let mut f = ClientFilter::new();
        let out = f.feed(b"RFB 003.003\n\x00", true).unwrap();
        assert_eq!(out.forward, b"RFB 003.003\n\x01");
    }

    #[test]
    fn view_only_drops_input_and_keeps_updates() {
        let mut f = ClientFilter::new();
        handshake(&mut f);
        let key = [4u8, 1, 0, 0, 0, 0, 0xff, 0x0d];
        let ptr = [5u8, 1, 0, 10, 0, 20];
        let req = [3u8, 0, 0, 0, 0, 0, 0, 100, 0, 100];
        let enc = [2u8, 0, 0, 2, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0x21];
        let mut all = Vec::new();
        for m in [&key[..], &ptr, &req, &enc] {
            all.extend_from_slice(m);
        }
        let out = f.feed(&all, false).unwrap();
        assert_eq!(out.dropped, 2);
        assert_eq!(out.forward, [&req[..], &enc].concat());
        // the same viewer, once it has control, sends input
        let out = f.feed(&key, true).unwrap();
        assert_eq!(out.forward, key);
    }

    #[test]
    fn messages_split_across_frames_are_reassembled() {
        let mut f = ClientFilter::new();
        handshake(&mut f);
        let cut = [6u8, 0, 0, 0, 0, 0, 0, 3, b'a', b'b', b'c'];
        let mut fwd = Vec::new();
        for b in cut {
            fwd.extend(f.feed(&[b], true).unwrap().forward);
        }
        assert_eq!(fwd, cut);
        // viewer: the paste is dropped whole, nothing leaks through
        let mut fwd = Vec::new();
        for b in cut {
            fwd.extend(f.feed(&[b], false).unwrap().forward);
        }
        assert!(fwd.is_empty());
    }

    #[test]
    fn qemu_extended_key_event_is_input() {
        let mut f = ClientFilter::new();
        handshake(&mut f);
        let ext_key = [255u8, 0, 0, 1, 0, 0, 0, 0x61, 0, 0, 0, 0x1e];
        assert_eq!(f.feed(&ext_key, false).unwrap().dropped, 1);
        assert_eq!(f.feed(&ext_key, true).unwrap().forward, ext_key);
    }

    #[test]
    fn garbage_is_refused() {
        let mut f = ClientFilter::new();
        assert!(f.feed(b"GET / HTTP/1.1\r\n", true).is_err());
        let mut f = ClientFilter::new();
        handshake(&mut f);
        assert!(f.feed(&[77, 0, 0, 0], true).is_err());
        let mut f = ClientFilter::new();
        assert!(f.feed(b"RFB 003.008\n\x10", true).is_err());
    }
}
