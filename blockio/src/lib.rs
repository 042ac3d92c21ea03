//! io_uring O_DIRECT writer (work in progress).
