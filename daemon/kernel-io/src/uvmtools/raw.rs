//! The raw ioctls, for callers that must send what [`EventTracker`] would not.

use super::abi;

nix::ioctl_readwrite_bad!(
    /// `UVM_TOOLS_INIT_EVENT_TRACKER_V2`, on a tools file.
    init_event_tracker_v2,
    abi::UVM_TOOLS_INIT_EVENT_TRACKER_V2,
    abi::InitEventTrackerParams
);
nix::ioctl_readwrite_bad!(
    /// `UVM_TOOLS_SET_NOTIFICATION_THRESHOLD`, on a tools file.
    set_notification_threshold,
    abi::UVM_TOOLS_SET_NOTIFICATION_THRESHOLD,
    abi::SetNotificationThresholdParams
);
nix::ioctl_readwrite_bad!(
    /// `UVM_TOOLS_EVENT_QUEUE_ENABLE_EVENTS`, on a tools file.
    enable_events,
    abi::UVM_TOOLS_EVENT_QUEUE_ENABLE_EVENTS,
    abi::EventQueueEventsParams
);
nix::ioctl_readwrite_bad!(
    /// `UVM_TOOLS_EVENT_QUEUE_DISABLE_EVENTS`, on a tools file.
    disable_events,
    abi::UVM_TOOLS_EVENT_QUEUE_DISABLE_EVENTS,
    abi::EventQueueEventsParams
);
nix::ioctl_readwrite_bad!(
    /// `UVM_TOOLS_FLUSH_EVENTS`, on an nvidia-uvm file.
    flush_events,
    abi::UVM_TOOLS_FLUSH_EVENTS,
    abi::FlushEventsParams
);
