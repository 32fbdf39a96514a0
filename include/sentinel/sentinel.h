#pragma once
// Overflow Sentinel: the whole public API.
#include <sentinel/block_scaling.h>
#include <sentinel/detect.h>
#include <sentinel/errors.h>
#include <sentinel/fp8.h>
#include <sentinel/fp8_scaling.h>
#include <sentinel/options.h>
#include <sentinel/ranks.h>
#include <sentinel/report.h>
#include <sentinel/scope.h>
#include <sentinel/stats.h>
#include <sentinel/version.h>
#include <sentinel/watchdog.h>
