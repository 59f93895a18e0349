// SPDX-License-Identifier: Apache-2.0

package server

import _ "embed"

// openAPI is the API's OpenAPI 3.1 document, served at /v1/openapi.json.
// It is written by hand; TestOpenAPICoversRoutes holds it to the routes.
//
//go:embed openapi.json
var openAPI []byte
