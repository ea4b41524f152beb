//! vela-models
