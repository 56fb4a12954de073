//! The policies the simulator compares: the named policies of the placement crate, the ones
//! `--placement` takes.

pub use remem_placement::Policy;
