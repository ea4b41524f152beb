//! vela-engine
