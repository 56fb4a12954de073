//! Links Debian's system ISA-L (package libisal-dev) dynamically.

fn main() {
    println!("cargo:rustc-link-lib=dylib=isal");
    println!("cargo:rerun-if-changed=build.rs");
}
