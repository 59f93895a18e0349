// SPDX-License-Identifier: Apache-2.0

// Package otelcheck holds the tests of shardq's OpenTelemetry spans and
// metrics against the OpenTelemetry SDK. They live in the command's
// module so that the library module does not require the SDK: a library
// user's module graph gets only the OpenTelemetry API.
package otelcheck
