//! schedules
