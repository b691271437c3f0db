//! The two ADS modes of section 3e (per-change cost), shared by its measurement and its plots.

/// The two ADS modes, in the order measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// `DELTA_GRPC` (the chart's bootstrap).
    Delta,
    /// `GRPC`, State of the World.
    Sotw,
}

impl Mode {
    /// The agent's `mode` metric label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Mode::Delta => "delta",
            Mode::Sotw => "sotw",
        }
    }

    /// How the report names it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Mode::Delta => "Delta",
            Mode::Sotw => "SotW",
        }
    }
}
