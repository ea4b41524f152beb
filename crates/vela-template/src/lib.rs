//! vela-template
