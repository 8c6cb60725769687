//! Builders for end-to-end tests.
