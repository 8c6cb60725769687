//! Placeholder until the binary lands.
fn main() {}
