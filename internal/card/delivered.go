package card

import (
	"math"
)

// uiDeliveredMinute is the delivered series' step: the chart's steps
// summed to at least a minute, since a step of a few seconds holds one or
// two sticky turns at most.
const uiDeliveredMinute = 60.0

// uiDeliveredSeries sums a chart's predicted and delivered tokens into
// steps of at least a minute, aligned to the chart's end (the oldest steps
// that do not fill one are left out), and returns each step's delivered
// share (0–1, nil where nothing was predicted) with the seconds per step.
func uiDeliveredSeries(predicted, delivered []uint64, stepS float64) (shares []*float64, perS float64) {
	n := min(len(predicted), len(delivered))
	per := 1
	if stepS > 0 && stepS < uiDeliveredMinute {
		per = int(math.Ceil(uiDeliveredMinute / stepS))
	}
	groups := n / per
	shares = make([]*float64, groups)
	off := n - groups*per
	for g := range groups {
		var p, d uint64
		for i := off + g*per; i < off+(g+1)*per; i++ {
			p += predicted[i]
			d += delivered[i]
		}
		if p > 0 {
			s := math.Round(float64(d)/float64(p)*1000) / 1000
			shares[g] = &s
		}
	}
	return shares, float64(per) * stepS
}

// uiDeliveredHour renders the delivered share over the chart's steps with
// its counts: "97.5% (12 k of 12.3 k tokens)", or "none yet".
func uiDeliveredHour(predicted, delivered []uint64, share *float64) uiVal {
	if share == nil {
		return uiVal{V: nil, T: "none yet"}
	}
	var p, d uint64
	for i := range min(len(predicted), len(delivered)) {
		p += predicted[i]
		d += delivered[i]
	}
	return uiVal{V: *share, T: uiPct(*share).T + " (" + uiTokenCount(d).T + " of " + uiTokenCount(p).T + " tokens)"}
}
