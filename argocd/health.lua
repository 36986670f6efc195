-- Argo CD health check for rerank.io/RerankModel (Lua 5.1, as Argo CD runs it; `obj` is the live object).
-- Source of truth: argocd/resource-customizations.yaml embeds this file verbatim (a unit test checks the copy).
--
--   Progressing  the operator has not yet observed the current spec (status.observedGeneration behind
--                metadata.generation, or a Ready condition set for an older generation), or the model is still
--                being built and rolled out (phase Pending, Quantizing, Progressing) without a failure.
--   Degraded     the Degraded condition is True, or phase is Degraded or Failed.
--   Healthy      Ready=True for the current generation.
-- There is no Suspended case: the API always keeps at least one pool serving (a CEL rule refuses anything else).
local hs = {}

local function condition(conditions, kind)
  if conditions == nil then
    return nil
  end
  for _, c in ipairs(conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

local function describe(c, fallback)
  if c == nil then
    return fallback
  end
  local text = c.reason or fallback
  if c.message ~= nil and c.message ~= "" then
    text = text .. ": " .. c.message
  end
  return text
end

local generation = 0
if obj.metadata ~= nil and obj.metadata.generation ~= nil then
  generation = obj.metadata.generation
end

local status = obj.status
if status == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe the RerankModel"
  return hs
end

local observed = status.observedGeneration
if observed == nil or observed < generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. tostring(generation)
  return hs
end

local phase = status.phase or ""
local ready = condition(status.conditions, "Ready")
local degraded = condition(status.conditions, "Degraded")

if degraded ~= nil and degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = describe(degraded, "Degraded")
  return hs
end

if phase == "Failed" or phase == "Degraded" then
  hs.status = "Degraded"
  hs.message = describe(ready, "Phase " .. phase)
  return hs
end

if ready ~= nil and ready.status == "True" then
  if ready.observedGeneration ~= nil and ready.observedGeneration < generation then
    hs.status = "Progressing"
    hs.message = "Ready was set for generation " .. tostring(ready.observedGeneration) .. ", waiting for "
      .. tostring(generation)
    return hs
  end
  hs.status = "Healthy"
  hs.message = describe(ready, "Ready")
  return hs
end

hs.status = "Progressing"
if phase ~= "" then
  hs.message = "Phase " .. phase .. " (" .. describe(ready, "not Ready yet") .. ")"
else
  hs.message = describe(ready, "Not Ready yet")
end
return hs
