// Package ext is the rerank-operator dev cluster's own stand-in for Traefik's dynamic-configuration extension point.
//
// Traefik embeds ext.HTTP in its dynamic.HTTPConfiguration and ext.Router in its dynamic.Router (inline, so that a
// distribution can add fields) and copies them by value in its generated DeepCopy functions; nothing else refers to
// them. The open-source build adds no fields, so two empty structs are the whole API surface it needs.
package ext

// HTTP is embedded inline in Traefik's dynamic.HTTPConfiguration; no extra fields.
type HTTP struct{}

// Router is embedded inline in Traefik's dynamic.Router; no extra fields.
type Router struct{}
