//! Hardware tests live in tests/.
