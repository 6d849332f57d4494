//! [`c_struct!`]: a `#[repr(C)]` struct declared together with its C name and field offsets, for
//! the tests that compare the Rust view of a C header (`wic.h`, `wic_abi.h`, `wic_fakegpu.h`)
//! with what a C compiler makes of it.

/// Declares a `#[repr(C)]` struct together with its C name and the offset of every field, so
/// the ABI test sees exactly the fields the struct has.
#[macro_export]
macro_rules! c_struct {
    (
        $(#[$meta:meta])*
        pub struct $name:ident = $c_name:literal {
            $( $(#[$field_meta:meta])* pub $field:ident: $ty:ty, )*
        }
    ) => {
        $(#[$meta])*
        #[repr(C)]
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct $name {
            $( $(#[$field_meta])* pub $field: $ty, )*
        }

        impl $name {
            /// The struct's name in its C header (without `struct`).
            pub const C_NAME: &'static str = $c_name;
            /// Every field, in declaration order, with its byte offset.
            pub const FIELDS: &'static [(&'static str, usize)] =
                &[$( (stringify!($field), std::mem::offset_of!($name, $field)), )*];
        }
    };
}
