//! Error mapping on recorded LXD responses.
