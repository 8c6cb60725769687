//! The OpenAPI documents, as served and as checked in, pass an independent validator
//! (openapi-spec-validator) and a strict parse that fails on a key given twice — the fault
//! that once made parsers silently drop three operations.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap should fail loudly

use toolrelay_tests::system::System;
use toolrelay_tests::{repo_file, test_python};

#[tokio::test]
async fn served_and_checked_in_documents_are_valid_openapi_with_each_path_once() {
    let system = System::start().await;
    let directory =
        std::env::temp_dir().join(format!("toolrelay-documents-{}", std::process::id()));
    std::fs::create_dir_all(&directory).unwrap();
    let mut files = vec![
        repo_file("openapi/openapi.json"),
        repo_file("openapi/actions.json"),
    ];
    for (path, name) in [
        ("/openapi.json", "served-openapi.json"),
        ("/openapi.yaml", "served-openapi.yaml"),
        ("/openapi/actions.json", "served-actions.json"),
    ] {
        let body = system
            .http
            .get(system.url(path))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let file = directory.join(name);
        std::fs::write(&file, body).unwrap();
        files.push(file);
    }
    let output = tokio::process::Command::new(test_python())
        .arg(repo_file("tests/python/validate_openapi.py"))
        .args(&files)
        .output()
        .await
        .unwrap();
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    std::fs::remove_dir_all(&directory).unwrap();
    assert!(output.status.success(), "{report}");
    assert_eq!(
        report.matches("valid OpenAPI").count(),
        files.len(),
        "{report}"
    );
    // The LLM's GET and the tab's DELETE share a path: both are there.
    let full: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(repo_file("openapi/openapi.json")).unwrap())
            .unwrap();
    for (path, methods) in [
        ("/api/sessions/{code}", ["get", "delete"]),
        ("/api/sessions/{code}/request", ["post", "get"]),
        ("/api/sessions/{code}/response", ["get", "post"]),
    ] {
        for method in methods {
            assert!(full["paths"][path][method].is_object(), "{method} {path}");
        }
    }
    system.stop().await;
}
