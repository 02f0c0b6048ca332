//! Massif: heap usage over time, its peak, and who allocated it (to be written).
