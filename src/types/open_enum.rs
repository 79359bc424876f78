//! String enums that keep what they do not know. KubeVirt's phases, condition types and
//! reasons are strings on the wire; edgevirt matches on them as enums, and a value only a
//! newer peer knows decodes as `Other(value)` and is written back unchanged. Anything that is
//! not a string (`"phase": 3`) is refused, naming the field.

/// `open_enum! { /// doc  pub enum Name { Variant => "Wire", ... } }`: the enum with an
/// `Other(String)` variant, `as_str`, `Display`, `From<&str>`, string serde and a string
/// JSON schema (so served schemas do not change).
#[macro_export]
macro_rules! open_enum {
    ($(#[$m:meta])* pub enum $name:ident { $($(#[$vm:meta])* $v:ident => $s:literal,)+ }) => {
        $(#[$m])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $($(#[$vm])* $v,)+
            /// A value this release does not know, kept as it came.
            Other(String),
        }

        impl $name {
            pub fn as_str(&self) -> &str {
                match self {
                    $($name::$v => $s,)+
                    $name::Other(s) => s,
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                match s {
                    $($s => $name::$v,)+
                    other => $name::Other(other.to_string()),
                }
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.as_str() == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.as_str() == *other
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = <std::borrow::Cow<'de, str> as serde::Deserialize>::deserialize(d)?;
                Ok($name::from(s.as_ref()))
            }
        }

        impl schemars::JsonSchema for $name {
            fn inline_schema() -> bool {
                true
            }
            fn schema_name() -> std::borrow::Cow<'static, str> {
                <String as schemars::JsonSchema>::schema_name()
            }
            fn json_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
                <String as schemars::JsonSchema>::json_schema(g)
            }
        }
    };
}

#[cfg(test)]
mod tests {
    open_enum! {
        /// A test enum.
        pub enum Colour {
            Red => "Red",
            DarkBlue => "DarkBlue",
        }
    }

    #[test]
    fn known_unknown_and_wrong_values() {
        let c: Colour = serde_json::from_value(serde_json::json!("DarkBlue")).unwrap();
        assert_eq!(c, Colour::DarkBlue);
        let c: Colour = serde_json::from_value(serde_json::json!("Green")).unwrap();
        assert_eq!(c, Colour::Other("Green".into()));
        assert_eq!(serde_json::to_value(&c).unwrap(), "Green");
        assert_eq!(serde_json::to_value(Colour::Red).unwrap(), "Red");
        let e = serde_json::from_value::<Colour>(serde_json::json!(3)).unwrap_err();
        assert!(e.to_string().contains("invalid type: integer `3`"), "{e}");
    }
}
