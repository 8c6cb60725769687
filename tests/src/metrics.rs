//! Reading a `/metrics` page the way Prometheus would: fetched over HTTP and parsed by the
//! Prometheus project's own Python parser (`tests/python/parse_metrics.py`), not by the crate
//! that wrote it; tests then ask for series by name and labels.

use std::collections::BTreeMap;

use serde_json::Value;

/// A parsed `/metrics` page.
#[derive(Debug)]
pub struct Scrape {
    /// The page as served.
    pub text: String,
    /// Its `Content-Type`.
    pub content_type: String,
    /// Each family's type, by family name.
    pub families: BTreeMap<String, String>,
    /// Every sample.
    pub samples: Vec<Sample>,
}

/// One sample: a series and its value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The sample's name (`…_total`, `…_bucket`, …).
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its value.
    pub value: f64,
}

impl Scrape {
    /// Fetches `url` and parses it; panics unless it is a 200 that parses.
    pub async fn fetch(http: &reqwest::Client, url: &str) -> Self {
        let response = http.get(url).send().await.unwrap();
        assert_eq!(response.status(), reqwest::StatusCode::OK, "{url}");
        let content_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let text = response.text().await.unwrap();
        Self::parse(text, content_type).await
    }

    /// Parses `text` with the Prometheus parser; panics when it does not parse.
    pub async fn parse(text: String, content_type: String) -> Self {
        let output =
            crate::python_on_file("parse_metrics.py", "metrics.txt", text.as_bytes()).await;
        assert!(
            output.status.success(),
            "the Prometheus parser refused the page: {}\n{text}",
            String::from_utf8_lossy(&output.stderr)
        );
        let parsed: Value = serde_json::from_slice(&output.stdout).unwrap();
        let families = parsed["families"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(name, kind)| (name.clone(), kind.as_str().unwrap().to_owned()))
            .collect();
        let samples = parsed["samples"]
            .as_array()
            .unwrap()
            .iter()
            .map(|sample| Sample {
                name: sample[0].as_str().unwrap().to_owned(),
                labels: sample[1]
                    .as_object()
                    .unwrap()
                    .iter()
                    .map(|(key, value)| (key.clone(), value.as_str().unwrap().to_owned()))
                    .collect(),
                value: sample[2].as_f64().unwrap(),
            })
            .collect();
        Self {
            text,
            content_type,
            families,
            samples,
        }
    }

    /// The value of the series `name` with exactly these labels; panics when there is none.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let wanted: BTreeMap<String, String> = labels
            .iter()
            .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
            .collect();
        self.samples
            .iter()
            .find(|sample| sample.name == name && sample.labels == wanted)
            .unwrap_or_else(|| panic!("no series {name}{labels:?} in\n{}", self.text))
            .value
    }

    /// The sum over every series named `name` whose labels include `labels`.
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|sample| sample.name == name)
            .filter(|sample| {
                labels
                    .iter()
                    .all(|(key, value)| sample.labels.get(*key).map(String::as_str) == Some(value))
            })
            .map(|sample| sample.value)
            .sum()
    }

    /// Every label value on the page.
    pub fn label_values(&self) -> impl Iterator<Item = &str> {
        self.samples
            .iter()
            .flat_map(|sample| sample.labels.values().map(String::as_str))
    }
}
