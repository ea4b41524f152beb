//! vela-compute
