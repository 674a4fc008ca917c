//! FabricProfiles read from a file given on the command line.

use std::path::Path;

use railguard_api::FabricProfile;

use crate::error::StartupError;

/// The FabricProfiles of the YAML stream in `path` (given with `flag`); none is an error.
pub fn read_profiles(path: &Path, flag: &str) -> Result<Vec<FabricProfile>, StartupError> {
    let what = "FabricProfile file";
    let text = std::fs::read_to_string(path)
        .map_err(|e| StartupError::unreadable(what, path, flag, &e))?;
    let profiles = railguard_api::profiles_from_yaml(&text).map_err(|e| {
        StartupError::invalid(
            what,
            path,
            flag,
            &e,
            "fix the YAML stream of FabricProfiles (api/fixtures/profiles/ has examples)",
        )
    })?;
    if profiles.is_empty() {
        return Err(StartupError::new(
            format!("invalid {what} {} ({flag})", path.display()),
            "it holds no FabricProfile",
            "give at least one FabricProfile",
        ));
    }
    Ok(profiles)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_file_errors_name_the_file_and_the_flag() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("p.yaml");
        let e = read_profiles(&p, "--profiles").unwrap_err();
        assert!(
            e.to_string().starts_with(&format!(
                "cannot read FabricProfile file {} (--profiles): no such file",
                p.display()
            )),
            "{e}"
        );
        std::fs::write(&p, "apiVersion: railguard.io/v1alpha1\nkind: FabricProfile\nmetadata: {name: x}\nspec: {rails: 7}\n").unwrap();
        let e = read_profiles(&p, "--profile-file").unwrap_err();
        assert!(
            e.problem
                == format!(
                    "invalid FabricProfile file {} (--profile-file)",
                    p.display()
                ),
            "{e}"
        );
        std::fs::write(&p, "").unwrap();
        let e = read_profiles(&p, "--profiles").unwrap_err();
        assert_eq!(e.cause, "it holds no FabricProfile");
        let good = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../api/fixtures/profiles/dgx-h100-ndr.yaml"),
        )
        .unwrap();
        std::fs::write(&p, good).unwrap();
        assert_eq!(read_profiles(&p, "--profiles").unwrap().len(), 1);
    }
}
