//! The join token's format, which the controller issues and an agent parses:
//! `ev1.<secret>.<sha256 of the controller's certificate, hex>`.

/// The prefix of join tokens of this format.
pub const JOIN_TOKEN_PREFIX: &str = "ev1";
/// The parts of a join token: (secret, certificate pin).
pub fn parse_join_token(t: &str) -> Option<(&str, &str)> {
    let mut it = t.trim().split('.');
    let (p, secret, pin) = (it.next()?, it.next()?, it.next()?);
    let hex64 = |s: &str| s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit());
    (p == JOIN_TOKEN_PREFIX && it.next().is_none() && secret.len() >= 32 && hex64(pin))
        .then_some((secret, pin))
}
