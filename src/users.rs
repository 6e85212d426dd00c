//! The user a service runs as (`user = "NAME"` or `"UID:GID"`), read from
//! the image's /etc/passwd and /etc/group by tend itself: a static binary
//! has no NSS, and an image has no other source that a container trusts.
//!
//! What login would set is set: the uid, the primary gid and every group
//! that lists the user, and HOME, USER and LOGNAME.

use std::fmt;
use std::path::Path;

/// `user`: a name from the image's /etc/passwd, or numeric ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum User {
    Name(String),
    Ids { uid: u32, gid: u32 },
}

impl User {
    pub(crate) fn parse(text: &str) -> Result<User, String> {
        if let Some((uid, gid)) = text.split_once(':') {
            let id = |s: &str| s.parse::<u32>().ok().filter(|_| !s.starts_with('+'));
            return match (id(uid), id(gid)) {
                (Some(uid), Some(gid)) => Ok(User::Ids { uid, gid }),
                _ => Err(format!(
                    "`user` {text:?} is neither a user name nor numeric \"UID:GID\" (like \"101:101\")"
                )),
            };
        }
        let valid = !text.is_empty()
            && !text.starts_with('-')
            && text
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '$'));
        if !valid {
            return Err(format!(
                "`user` {text:?} is not a user name: use a name from the image's /etc/passwd, or \"UID:GID\""
            ));
        }
        Ok(User::Name(text.to_string()))
    }
}

impl fmt::Display for User {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            User::Name(n) => f.write_str(n),
            User::Ids { uid, gid } => write!(f, "{uid}:{gid}"),
        }
    }
}

/// A user as the service gets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    /// The name from /etc/passwd; None for numeric ids it does not list.
    pub name: Option<String>,
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups: the primary gid, then every group of
    /// /etc/group that lists the user by name.
    pub groups: Vec<u32>,
    pub home: String,
}

/// /etc/group lists at most this many groups per user that tend keeps (the
/// kernel's NGROUPS_MAX is 65536; login keeps far fewer in practice).
const MAX_GROUPS: usize = 1024;

impl Account {
    /// Looks `name` up in `root`/etc/passwd.
    pub fn look_up(name: &str, root: &Path) -> Result<Account, String> {
        let passwd = read(root, "etc/passwd")?;
        let entry = passwd
            .lines()
            .filter_map(PasswdEntry::parse)
            .find(|e| e.name == name)
            .ok_or_else(|| format!("no user {name:?} in /etc/passwd"))?;
        Ok(entry.account(root))
    }

    /// The account of `user`: a name must be in /etc/passwd; numeric ids
    /// need not be (then HOME is /, as container runtimes set it).
    pub fn resolve(user: &User, root: &Path) -> Result<Account, String> {
        match user {
            User::Name(name) => Account::look_up(name, root),
            User::Ids { uid, gid } => {
                let listed = read(root, "etc/passwd").ok().and_then(|passwd| {
                    passwd
                        .lines()
                        .filter_map(PasswdEntry::parse)
                        .find(|e| e.uid == *uid)
                        .map(|e| e.account(root))
                });
                Ok(match listed {
                    Some(mut a) => {
                        // The gid asked for is the primary one.
                        a.groups.retain(|g| g != gid);
                        a.groups.insert(0, *gid);
                        a.gid = *gid;
                        a
                    }
                    None => Account {
                        name: None,
                        uid: *uid,
                        gid: *gid,
                        groups: vec![*gid],
                        home: "/".to_string(),
                    },
                })
            }
        }
    }

    /// HOME, USER and LOGNAME, as login sets them (USER and LOGNAME only
    /// with a name).
    pub fn variables(&self) -> Vec<(String, String)> {
        let mut vars = vec![("HOME".to_string(), self.home.clone())];
        if let Some(name) = &self.name {
            vars.push(("USER".to_string(), name.clone()));
            vars.push(("LOGNAME".to_string(), name.clone()));
        }
        vars
    }
}

fn read(root: &Path, file: &str) -> Result<String, String> {
    let path = root.join(file);
    std::fs::read(&path)
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
        .map_err(|e| format!("cannot read /{file}: {e}"))
}

/// One line of /etc/passwd: `name:password:uid:gid:gecos:home:shell`.
struct PasswdEntry<'a> {
    name: &'a str,
    uid: u32,
    gid: u32,
    home: &'a str,
}

impl<'a> PasswdEntry<'a> {
    fn parse(line: &'a str) -> Option<PasswdEntry<'a>> {
        let mut f = line.split(':');
        let name = f.next().filter(|n| !n.is_empty() && !n.starts_with('#'))?;
        let _password = f.next()?;
        let uid = f.next()?.parse().ok()?;
        let gid = f.next()?.parse().ok()?;
        let _gecos = f.next()?;
        let home = f.next()?;
        Some(PasswdEntry {
            name,
            uid,
            gid,
            home,
        })
    }

    fn account(&self, root: &Path) -> Account {
        let mut groups = vec![self.gid];
        if let Ok(group) = read(root, "etc/group") {
            // `name:password:gid:member,member`
            for line in group.lines() {
                let mut f = line.split(':');
                let (Some(_), Some(_), Some(gid), Some(members)) =
                    (f.next(), f.next(), f.next(), f.next())
                else {
                    continue;
                };
                let Ok(gid) = gid.parse::<u32>() else {
                    continue;
                };
                if members.split(',').any(|m| m.trim() == self.name)
                    && !groups.contains(&gid)
                    && groups.len() < MAX_GROUPS
                {
                    groups.push(gid);
                }
            }
        }
        Account {
            name: Some(self.name.to_string()),
            uid: self.uid,
            gid: self.gid,
            groups,
            home: if self.home.is_empty() {
                "/".to_string()
            } else {
                self.home.to_string()
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("etc")).unwrap();
        std::fs::write(
            dir.path().join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/bash\n\
             # a comment\n\
             www-data:x:33:33:www-data:/var/www:/usr/sbin/nologin\n\
             broken line\n\
             app:x:1000:1000::/home/app:/bin/sh\n\
             nohome:x:1001:1001:::/bin/sh\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("etc/group"),
            "root:x:0:\n\
             www-data:x:33:\n\
             ssl-cert:x:110:www-data,app\n\
             video:x:44: app \n\
             bad:x:notanumber:app\n",
        )
        .unwrap();
        dir
    }

    #[test]
    fn a_name_gets_its_ids_groups_and_home_from_the_image() {
        let r = root();
        let a = Account::look_up("app", r.path()).unwrap();
        assert_eq!(
            a,
            Account {
                name: Some("app".into()),
                uid: 1000,
                gid: 1000,
                groups: vec![1000, 110, 44],
                home: "/home/app".into(),
            }
        );
        assert_eq!(
            a.variables(),
            [
                ("HOME".to_string(), "/home/app".to_string()),
                ("USER".to_string(), "app".to_string()),
                ("LOGNAME".to_string(), "app".to_string()),
            ]
        );
        let w = Account::look_up("www-data", r.path()).unwrap();
        assert_eq!((w.uid, w.gid, w.groups), (33, 33, vec![33, 110]));
        assert_eq!(Account::look_up("nohome", r.path()).unwrap().home, "/");
    }

    #[test]
    fn an_unknown_name_is_an_error_that_names_it() {
        let r = root();
        let e = Account::look_up("nginx", r.path()).unwrap_err();
        assert_eq!(e, "no user \"nginx\" in /etc/passwd");
        let empty = tempfile::tempdir().unwrap();
        let e = Account::look_up("app", empty.path()).unwrap_err();
        assert!(e.starts_with("cannot read /etc/passwd: "), "{e}");
    }

    #[test]
    fn numeric_ids_need_no_entry_but_use_one_that_is_there() {
        let r = root();
        let listed = Account::resolve(&User::Ids { uid: 33, gid: 44 }, r.path()).unwrap();
        assert_eq!(listed.name.as_deref(), Some("www-data"));
        assert_eq!((listed.gid, listed.groups), (44, vec![44, 33, 110]));
        let unlisted = Account::resolve(&User::Ids { uid: 4242, gid: 7 }, r.path()).unwrap();
        assert_eq!(
            unlisted,
            Account {
                name: None,
                uid: 4242,
                gid: 7,
                groups: vec![7],
                home: "/".into(),
            }
        );
        assert_eq!(
            unlisted.variables(),
            [("HOME".to_string(), "/".to_string())]
        );
    }
}
