//! The toolrelay gateway.
