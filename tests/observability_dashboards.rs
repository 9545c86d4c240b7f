//! The Grafana dashboards under `grafana/dashboards` query only metrics of
//! `weir::metrics::CATALOGUE` (histograms through their `_bucket`, `_sum`
//! and `_count` series), through the `datasource` template variable, and
//! every panel has a query.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::Value;
use weir::metrics::{MetricKind, CATALOGUE};

type TestResult<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

/// The series a Prometheus histogram is exported as, besides its name.
const HISTOGRAM_SUFFIXES: &[&str] = &["_bucket", "_sum", "_count"];
/// The only data source a panel or a query may name.
const DATASOURCE_VARIABLE: &str = "${datasource}";

/// A dashboard file and its parsed JSON.
struct Dashboard {
    file: String,
    json: Value,
}

fn dashboards_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("grafana")
        .join("dashboards")
}

/// Every `*.json` under `grafana/dashboards`, parsed, sorted by file name.
fn dashboards() -> TestResult<Vec<Dashboard>> {
    let dir = dashboards_dir();
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))? {
        let path = entry?.path();
        if path.extension().is_none_or(|ext| ext != "json") {
            continue;
        }
        let text = std::fs::read_to_string(&path)?;
        let json = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let file = path
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_default();
        out.push(Dashboard { file, json });
    }
    out.sort_by(|a, b| a.file.cmp(&b.file));
    if out.is_empty() {
        return Err(format!("no dashboard under {}", dir.display()).into());
    }
    Ok(out)
}

/// Every panel of a dashboard, the panels nested in rows included.
fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    collect_panels(dashboard.get("panels"), &mut out);
    out
}

fn collect_panels<'a>(panels: Option<&'a Value>, out: &mut Vec<&'a Value>) {
    for panel in panels.and_then(Value::as_array).into_iter().flatten() {
        out.push(panel);
        collect_panels(panel.get("panels"), out);
    }
}

fn is_row(panel: &Value) -> bool {
    panel.get("type").and_then(Value::as_str) == Some("row")
}

fn title(panel: &Value) -> &str {
    panel.get("title").and_then(Value::as_str).unwrap_or("")
}

/// The names a panel goes by in failure messages.
fn describe(file: &str, panel: &Value) -> String {
    let id = panel.get("id").map(Value::to_string).unwrap_or_default();
    format!("{file}: panel {id} {:?}", title(panel))
}

/// The `expr` of each of a panel's targets (empty when a target has none).
fn exprs(panel: &Value) -> Vec<&str> {
    panel
        .get("targets")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|target| target.get("expr").and_then(Value::as_str).unwrap_or(""))
        .collect()
}

/// The words of `expr` that start with `weir_`: a word is a maximal run of
/// ASCII letters, digits, `_` and `:` (the characters of a Prometheus metric
/// name), so a catalogue name is made of `[a-z0-9_]` and anything else
/// starting with `weir_` is reported as it is written.
fn metric_words(expr: &str) -> Vec<&str> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|word| word.starts_with("weir_"))
        .collect()
}

/// The catalogue metric a series name belongs to: itself, or the histogram
/// it is the `_bucket`, `_sum` or `_count` series of.
fn catalogue_metric(series: &str) -> Option<&'static str> {
    if let Some((name, ..)) = CATALOGUE.iter().find(|(name, ..)| *name == series) {
        return Some(name);
    }
    HISTOGRAM_SUFFIXES.iter().find_map(|suffix| {
        let base = series.strip_suffix(suffix)?;
        CATALOGUE
            .iter()
            .find(|(name, kind, ..)| *name == base && *kind == MetricKind::Histogram)
            .map(|(name, ..)| *name)
    })
}

/// Every `datasource` value anywhere under `value`, with its JSON path.
fn datasources<'a>(value: &'a Value, path: String, out: &mut Vec<(String, &'a Value)>) {
    match value {
        Value::Object(map) => {
            for (key, inner) in map {
                let inner_path = format!("{path}.{key}");
                if key == "datasource" {
                    out.push((inner_path.clone(), inner));
                }
                datasources(inner, inner_path, out);
            }
        }
        Value::Array(items) => {
            for (i, inner) in items.iter().enumerate() {
                datasources(inner, format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// Whether a `datasource` value is the `datasource` template variable.
fn is_datasource_variable(datasource: &Value) -> bool {
    match datasource {
        Value::String(name) => name == DATASOURCE_VARIABLE,
        Value::Object(map) => map.get("uid").and_then(Value::as_str) == Some(DATASOURCE_VARIABLE),
        _ => false,
    }
}

#[test]
fn every_metric_a_dashboard_queries_is_in_the_catalogue() -> TestResult {
    let mut unknown = Vec::new();
    let mut queried = 0;
    for dashboard in dashboards()? {
        for panel in panels(&dashboard.json) {
            for expr in exprs(panel) {
                for word in metric_words(expr) {
                    queried += 1;
                    if catalogue_metric(word).is_none() {
                        unknown.push(format!("{}: {word}", describe(&dashboard.file, panel)));
                    }
                }
            }
        }
    }
    assert!(queried > 0, "the dashboards query no weir_ metric");
    assert!(
        unknown.is_empty(),
        "metrics outside weir::metrics::CATALOGUE:\n{}",
        unknown.join("\n")
    );
    Ok(())
}

#[test]
fn every_catalogue_metric_is_shown_on_some_dashboard() -> TestResult {
    let mut shown = BTreeSet::new();
    for dashboard in dashboards()? {
        for panel in panels(&dashboard.json) {
            for expr in exprs(panel) {
                shown.extend(metric_words(expr).into_iter().filter_map(catalogue_metric));
            }
        }
    }
    let missing: Vec<&str> = CATALOGUE
        .iter()
        .map(|(name, ..)| *name)
        .filter(|name| !shown.contains(name))
        .collect();
    assert!(
        missing.is_empty(),
        "catalogue metrics no dashboard panel shows (add a panel): {missing:?}"
    );
    Ok(())
}

#[test]
fn every_dashboard_has_the_prometheus_datasource_template_variable() -> TestResult {
    for dashboard in dashboards()? {
        let variables = dashboard
            .json
            .pointer("/templating/list")
            .and_then(Value::as_array)
            .ok_or_else(|| format!("{}: no templating.list", dashboard.file))?;
        let found = variables.iter().any(|variable| {
            variable.get("name").and_then(Value::as_str) == Some("datasource")
                && variable.get("type").and_then(Value::as_str) == Some("datasource")
                && variable.get("query").and_then(Value::as_str) == Some("prometheus")
        });
        assert!(
            found,
            "{}: no template variable `datasource` of type datasource, query prometheus",
            dashboard.file
        );
    }
    Ok(())
}

#[test]
fn no_panel_or_query_names_a_datasource_other_than_the_template_variable() -> TestResult {
    for dashboard in dashboards()? {
        let Some(panel_list) = dashboard.json.get("panels") else {
            return Err(format!("{}: no panels", dashboard.file).into());
        };
        let mut found = Vec::new();
        datasources(panel_list, "panels".to_string(), &mut found);
        for (path, datasource) in found {
            assert!(
                is_datasource_variable(datasource),
                "{}: {path} is {datasource}, not {DATASOURCE_VARIABLE}",
                dashboard.file
            );
        }
        for panel in panels(&dashboard.json).into_iter().filter(|p| !is_row(p)) {
            assert!(
                panel.get("datasource").is_some_and(is_datasource_variable),
                "{} does not use the {DATASOURCE_VARIABLE} data source",
                describe(&dashboard.file, panel)
            );
        }
    }
    Ok(())
}

#[test]
fn every_panel_has_a_query_with_a_non_empty_expr() -> TestResult {
    for dashboard in dashboards()? {
        let queried: Vec<&Value> = panels(&dashboard.json)
            .into_iter()
            .filter(|p| !is_row(p))
            .collect();
        assert!(!queried.is_empty(), "{}: no panels", dashboard.file);
        for panel in queried {
            assert!(
                exprs(panel).iter().any(|expr| !expr.trim().is_empty()),
                "{} has no target with an expr",
                describe(&dashboard.file, panel)
            );
        }
    }
    Ok(())
}

#[test]
fn every_panel_has_a_title_and_a_unit_and_every_time_series_a_legend() -> TestResult {
    for dashboard in dashboards()? {
        for panel in panels(&dashboard.json).into_iter().filter(|p| !is_row(p)) {
            let name = describe(&dashboard.file, panel);
            assert!(!title(panel).trim().is_empty(), "{name} has no title");
            let unit = panel
                .pointer("/fieldConfig/defaults/unit")
                .and_then(Value::as_str)
                .unwrap_or("");
            assert!(!unit.is_empty(), "{name} has no unit");
            if panel.get("type").and_then(Value::as_str) == Some("timeseries") {
                assert_eq!(
                    panel.pointer("/options/legend/showLegend"),
                    Some(&Value::Bool(true)),
                    "{name} hides its legend"
                );
            }
        }
    }
    Ok(())
}

#[test]
fn dashboard_uids_and_panel_ids_are_unique() -> TestResult {
    let mut uids = BTreeMap::new();
    for dashboard in dashboards()? {
        let uid = dashboard
            .json
            .get("uid")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("{}: no uid", dashboard.file))?
            .to_string();
        let previous = uids.insert(uid.clone(), dashboard.file.clone());
        assert!(
            previous.is_none(),
            "{} shares the uid {uid} with {previous:?}",
            dashboard.file
        );
        let mut ids = BTreeSet::new();
        for panel in panels(&dashboard.json) {
            let id = panel
                .get("id")
                .and_then(Value::as_u64)
                .ok_or_else(|| format!("{} has no numeric id", describe(&dashboard.file, panel)))?;
            assert!(
                ids.insert(id),
                "{}: panel id {id} used twice",
                dashboard.file
            );
        }
    }
    Ok(())
}

#[test]
fn metric_names_are_read_as_whole_words_of_an_expression() {
    let expr = "histogram_quantile(0.95, sum by (le) (rate(weir_sink_apply_duration_seconds_bucket{sink=\"pg\"}[$__rate_interval]))) / weir_Upper + xweir_no + weir_a:b";
    assert_eq!(
        metric_words(expr),
        vec![
            "weir_sink_apply_duration_seconds_bucket",
            "weir_Upper",
            "weir_a:b"
        ]
    );
}

#[test]
fn histogram_series_suffixes_resolve_only_for_histograms() {
    assert_eq!(
        catalogue_metric("weir_update_duration_seconds_bucket"),
        Some("weir_update_duration_seconds")
    );
    assert_eq!(
        catalogue_metric("weir_sink_batch_size_actions_count"),
        Some("weir_sink_batch_size_actions")
    );
    assert_eq!(
        catalogue_metric("weir_update_runs_total"),
        Some("weir_update_runs_total")
    );
    assert_eq!(catalogue_metric("weir_update_runs_total_count"), None);
    assert_eq!(catalogue_metric("weir_component_inflight_sum"), None);
    assert_eq!(catalogue_metric("weir_not_a_metric"), None);
}

#[test]
fn panels_nested_in_collapsed_rows_are_walked() {
    let dashboard = serde_json::json!({
        "panels": [
            {"id": 1, "type": "timeseries", "title": "top"},
            {"id": 2, "type": "row", "title": "row", "collapsed": true, "panels": [
                {"id": 3, "type": "stat", "title": "nested",
                 "targets": [{"expr": "weir_component_inflight"}]}
            ]}
        ]
    });
    let titles: Vec<&str> = panels(&dashboard).into_iter().map(title).collect();
    assert_eq!(titles, vec!["top", "row", "nested"]);
    let nested = panels(&dashboard)[2];
    assert_eq!(exprs(nested), vec!["weir_component_inflight"]);
}
