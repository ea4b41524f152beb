//! vela-server
