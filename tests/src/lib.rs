//! Harness for tests against real components (filled below).
