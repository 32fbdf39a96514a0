#pragma once
#define SENTINEL_VERSION_MAJOR 0
#define SENTINEL_VERSION_MINOR 1
#define SENTINEL_VERSION_PATCH 0
#define SENTINEL_VERSION_STRING "0.1.0"
// Version of the JSON report format (reports/report.schema.json).
#define SENTINEL_REPORT_SCHEMA_VERSION 11
