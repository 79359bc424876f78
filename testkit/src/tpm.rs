//! Raw TPM 2.0 commands a test sends through a guest's `/dev/tpm0` (the test guest has no
//! tpm2-tools): define an NV index, write it, read it back, all authorized by the owner
//! hierarchy's empty password (a TPM_RS_PW session), as a fresh vTPM has it. Layouts from
//! the TPM 2.0 Library, Part 3 (commands) and Part 2 (structures).

/// The NV index the tests use (in the owner's range, 0x01xxxxxx).
pub const NV_INDEX: u32 = 0x0150_0016;

const ST_SESSIONS: u16 = 0x8002;
const RH_OWNER: u32 = 0x4000_0001;
const RS_PW: u32 = 0x4000_0009;
const CC_NV_DEFINE_SPACE: u32 = 0x0000_012A;
const CC_NV_WRITE: u32 = 0x0000_0137;
const CC_NV_READ: u32 = 0x0000_014E;

/// A command: header (tag, size, code), handles, the password session, parameters.
fn command(code: u32, handles: &[u32], params: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    for h in handles {
        body.extend(h.to_be_bytes());
    }
    // Authorization area: its size, then one session: handle, empty nonce, attributes
    // (continueSession off), empty password.
    let session: Vec<u8> = [&RS_PW.to_be_bytes()[..], &[0, 0], &[0], &[0, 0]].concat();
    body.extend((session.len() as u32).to_be_bytes());
    body.extend(&session);
    body.extend(params);
    let mut cmd = Vec::new();
    cmd.extend(ST_SESSIONS.to_be_bytes());
    cmd.extend(((10 + body.len()) as u32).to_be_bytes());
    cmd.extend(code.to_be_bytes());
    cmd.extend(body);
    cmd
}

/// TPM2_NV_DefineSpace of [`NV_INDEX`], `size` bytes, read and written with the owner's
/// authorization (TPMA_NV_OWNERWRITE | TPMA_NV_OWNERREAD), SHA-256 names.
pub fn nv_define(size: u16) -> Vec<u8> {
    let mut public = Vec::new();
    public.extend(NV_INDEX.to_be_bytes());
    public.extend(0x000Bu16.to_be_bytes()); // TPM_ALG_SHA256
    public.extend(0x0002_0002u32.to_be_bytes());
    public.extend(0u16.to_be_bytes()); // no policy
    public.extend(size.to_be_bytes());
    let mut params = vec![0, 0]; // the index's own auth: empty
    params.extend((public.len() as u16).to_be_bytes());
    params.extend(public);
    command(CC_NV_DEFINE_SPACE, &[RH_OWNER], &params)
}

/// TPM2_NV_Write of `data` at offset 0 of [`NV_INDEX`].
pub fn nv_write(data: &[u8]) -> Vec<u8> {
    let mut params = (data.len() as u16).to_be_bytes().to_vec();
    params.extend(data);
    params.extend(0u16.to_be_bytes());
    command(CC_NV_WRITE, &[RH_OWNER, NV_INDEX], &params)
}

/// TPM2_NV_Read of `size` bytes at offset 0 of [`NV_INDEX`].
pub fn nv_read(size: u16) -> Vec<u8> {
    let mut params = size.to_be_bytes().to_vec();
    params.extend(0u16.to_be_bytes());
    command(CC_NV_READ, &[RH_OWNER, NV_INDEX], &params)
}

/// A shell command for the test guest that sends `cmd` to `/dev/tpm0` in one write and
/// prints the response as hex bytes (`od`), on one line.
pub fn guest_shell(cmd: &[u8]) -> String {
    let octal: String = cmd.iter().map(|b| format!("\\{b:03o}")).collect();
    format!(
        "printf '{octal}' >/tmp/tpm-cmd && exec 3<>/dev/tpm0 && cat /tmp/tpm-cmd >&3 && \
         dd bs=4096 count=1 <&3 2>/dev/null | od -An -tx1 -v | tr -d '\\n'"
    )
}

/// A response's bytes from [`guest_shell`]'s output, and its response code.
pub fn parse(hex: &str) -> Option<(u32, Vec<u8>)> {
    let bytes: Vec<u8> = hex
        .split_whitespace()
        .map(|b| u8::from_str_radix(b, 16).ok())
        .collect::<Option<_>>()?;
    let rc = u32::from_be_bytes(bytes.get(6..10)?.try_into().ok()?);
    Some((rc, bytes))
}

/// The data of a successful TPM2_NV_Read response (after the header and the parameter
/// size: a TPM2B with the bytes).
pub fn nv_read_data(resp: &[u8]) -> Option<Vec<u8>> {
    let n = u16::from_be_bytes(resp.get(14..16)?.try_into().ok()?) as usize;
    resp.get(16..16 + n).map(<[u8]>::to_vec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_carry_their_sizes() {
        for cmd in [nv_define(8), nv_write(b"edgevirt"), nv_read(8)] {
            let size = u32::from_be_bytes(cmd[2..6].try_into().unwrap()) as usize;
            assert_eq!(size, cmd.len());
        }
        assert_eq!(nv_define(8).len(), 45);
        assert_eq!(nv_write(b"edgevirt").len(), 43);
        assert_eq!(nv_read(8).len(), 35);
        let resp = "80 02 00 00 00 1d 00 00 00 00 00 00 00 0a 00 08 65 64 67 65 76 69 72 74";
        let (rc, bytes) = parse(resp).unwrap();
        assert_eq!(rc, 0);
        assert_eq!(nv_read_data(&bytes).unwrap(), b"edgevirt");
    }
}
