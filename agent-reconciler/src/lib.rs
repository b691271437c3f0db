//! The node reconciler embedded in `aether-agent` (proposal 034 Phase 1 and 1b, agent side).
//!
//! Not built yet: the watch drivers, index, annotation-first fold, delivery map and xDS server
//! are the subject of the issue "Node reconciler and xDS server". This crate exists so the
//! workspace has the layout of DESIGN.md; it exports nothing and claims nothing.
