fn main() {
    // sqlx::migrate! embeds migrations at build time; rebuild when one is added.
    println!("cargo:rerun-if-changed=migrations");
}
