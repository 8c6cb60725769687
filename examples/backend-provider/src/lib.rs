//! Example provider.
