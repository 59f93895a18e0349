// SPDX-License-Identifier: Apache-2.0

package server

import _ "embed"

//go:generate go test -run ^TestOpenAPIIsGenerated$ -update .

// openAPI is the API's OpenAPI 3.1 document, served at /v1/openapi.json.
// It is generated, never edited: buildOpenAPI makes it from apiDocs, the
// routes' roles and the Go types the handlers decode and answer, and
// `go generate ./internal/server` (in cmd/shardq) writes it here.
// TestOpenAPIIsGenerated fails while this file differs from what they
// make. The generator is test code, so that the reflection library is
// not linked into the binary, which serves the file as embedded.
//
//go:embed openapi.json
var openAPI []byte
