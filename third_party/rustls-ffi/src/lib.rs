//! Every rustls_* C function of rustls-ffi, in this one static library.
pub use rustls_ffi::*;
