//! Memcheck: heap misuse errors and leaks (to be written).
